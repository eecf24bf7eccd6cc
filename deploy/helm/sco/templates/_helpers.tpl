{{- define "sco.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "sco.labels" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "sco.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "sco.serviceAccount" -}}
{{- default (include "sco.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "sco.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/*
The pod spec every sco process shares: the image, `sco <args> --config`, the
configuration and region file, secrets as SCO_* variables, a writable /tmp on a
read-only root, probes on its /healthz and /readyz when it serves a port.
Call with (dict "root" $ "component" "run" "args" (list "run") "port" 9100).
*/}}
{{- define "sco.podSpec" -}}
{{- $v := .root.Values -}}
serviceAccountName: {{ include "sco.serviceAccount" .root }}
{{- with $v.imagePullSecrets }}
imagePullSecrets:
  {{- range . }}
  - name: {{ . }}
  {{- end }}
{{- end }}
securityContext:
  {{- toYaml $v.podSecurityContext | nindent 2 }}
{{- with $v.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
containers:
  - name: {{ .component }}
    image: {{ include "sco.image" .root }}
    imagePullPolicy: {{ $v.image.pullPolicy }}
    args:
      {{- range .args }}
      - {{ . | quote }}
      {{- end }}
      - --config
      - /etc/sco/sco.yaml
    env:
      - name: SCO_STATE__URL
        valueFrom:
          secretKeyRef: {name: {{ $v.secrets.databaseUrl.name }}, key: {{ $v.secrets.databaseUrl.key }}}
      {{- with $v.secrets.kafkaPassword }}{{ if .name }}
      - name: SCO_EVENTS__KAFKA__SASL_PASSWORD
        valueFrom:
          secretKeyRef: {name: {{ .name }}, key: {{ .key }}}
      {{- end }}{{ end }}
      {{- with $v.secrets.historyPassword }}{{ if .name }}
      - name: SCO_HISTORY__PASSWORD
        valueFrom:
          secretKeyRef: {name: {{ .name }}, key: {{ .key }}}
      {{- end }}{{ end }}
      {{- with $v.secrets.openbaoAppRole }}{{ if .name }}
      - name: BAO_ROLE_ID
        valueFrom:
          secretKeyRef: {name: {{ .name }}, key: {{ .roleIdKey }}}
      - name: BAO_SECRET_ID
        valueFrom:
          secretKeyRef: {name: {{ .name }}, key: {{ .secretIdKey }}}
      {{- end }}{{ end }}
      - name: OS_CLIENT_CONFIG_FILE
        value: /etc/sco/clouds/{{ $v.secrets.cloudsSecret.key }}
      - name: POD_NAME
        valueFrom:
          fieldRef: {fieldPath: metadata.name}
    {{- if .port }}
    ports:
      - name: http
        containerPort: {{ .port }}
    livenessProbe:
      httpGet: {path: /healthz, port: http}
      periodSeconds: 10
      failureThreshold: 3
    readinessProbe:
      httpGet: {path: /readyz, port: http}
      periodSeconds: 5
    {{- end }}
    resources:
      {{- toYaml .resources | nindent 6 }}
    securityContext:
      {{- toYaml $v.securityContext | nindent 6 }}
    volumeMounts:
      - {name: config, mountPath: /etc/sco/sco.yaml, subPath: sco.yaml, readOnly: true}
      - {name: config, mountPath: /etc/sco/region.yaml, subPath: region.yaml, readOnly: true}
      - {name: clouds, mountPath: /etc/sco/clouds, readOnly: true}
      {{- if $v.secrets.schedulerKubeconfigSecret.name }}
      - {name: kubeconfig, mountPath: /etc/sco/kubeconfig, readOnly: true}
      {{- end }}
      {{- if .tls }}
      - {name: tls, mountPath: /etc/sco/tls, readOnly: true}
      {{- end }}
      - {name: tmp, mountPath: /tmp}
volumes:
  - name: config
    configMap: {name: {{ include "sco.fullname" .root }}}
  - name: clouds
    secret: {secretName: {{ $v.secrets.cloudsSecret.name }}}
  {{- if $v.secrets.schedulerKubeconfigSecret.name }}
  - name: kubeconfig
    secret: {secretName: {{ $v.secrets.schedulerKubeconfigSecret.name }}}
  {{- end }}
  {{- if .tls }}
  - name: tls
    secret: {secretName: {{ .tls }}}
  {{- end }}
  - name: tmp
    emptyDir: {}
{{- end -}}

{{- define "sco.spread" -}}
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: {{ .root.Values.topologyKey }}
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        {{- include "sco.selector" . | nindent 8 }}
{{- end -}}
