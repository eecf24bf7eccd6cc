# shellcheck shell=bash
# Sourced by nova.sh: the stack's processes. Each daemon runs in a process
# group of its own, recorded in run/NAME.pid; they are stopped together
# (kill_stack), and a failed or interrupted `up` tears down what it started.

# ------------------------------------------------------ process groups ----
# Every daemon is started with setsid, so its pid is also its process group
# and session id. run/NAME.pid holds "PID STARTTIME" (STARTTIME from
# /proc/PID/stat) so that a stale file never makes us signal a reused pid.
proc_starttime() {
    local line
    read -r line 2>/dev/null < "/proc/$1/stat" || return 1
    line=${line##*) }
    set -- $line
    echo "${20}"
}

start_svc() {  # start_svc NAME CMD... (env prepared by caller)
    local name=$1; shift
    (
        export SCO_OS_STACK_DIR="$DIR" PYTHONPATH="$LIB${PYTHONPATH:+:$PYTHONPATH}"
        exec setsid "$@" >>"$LOGS/$name.out" 2>&1 </dev/null
    ) &
    local pid=$! st
    # The subshell is not a group leader, so setsid does not fork: this pid
    # is the daemon itself and its process group and session id.
    st=$(proc_starttime "$pid") || st=0
    echo "$pid $st" > "$RUN/$name.pid"
}

svc_pid() { local p _; read -r p _ < "$RUN/$1.pid" 2>/dev/null && echo "$p"; }

live_groups() {  # live_groups PGID...: those with a member that is not a zombie
    local want=" $* " line f fields
    declare -A seen=()
    for f in /proc/[0-9]*/stat; do
        read -r line 2>/dev/null < "$f" || continue
        read -ra fields <<< "${line##*) }"
        # fields: 0 state, 1 ppid, 2 pgrp, 3 session
        [ "${fields[0]}" = Z ] && continue
        [[ $want == *" ${fields[2]} "* ]] && seen[${fields[2]}]=1
    done
    [ ${#seen[@]} -eq 0 ] || printf '%s\n' "${!seen[@]}"
}

stack_alive_groups() {  # prints pids of recorded groups still alive
    local f pid st cur cands=()
    for f in "$RUN"/*.pid; do
        [ -e "$f" ] || continue
        read -r pid st < "$f" || continue
        [[ $pid =~ ^[0-9]+$ ]] || continue
        if [ -e "/proc/$pid" ]; then
            cur=$(proc_starttime "$pid") || cur=
            [ "$st" = 0 ] || [ "$cur" = "$st" ] || continue   # pid reused
        fi
        cands+=("$pid")
    done
    [ ${#cands[@]} -eq 0 ] || live_groups "${cands[@]}"
}

kill_stack() {
    [ -d "$RUN" ] || return 0
    local groups=() g p i
    mapfile -t groups < <(stack_alive_groups)
    if [ ${#groups[@]} -gt 0 ]; then
        log "stopping ${#groups[@]} process groups"
        for g in "${groups[@]}"; do kill -TERM -- "-$g" 2>/dev/null || true; done
        local left=()
        for ((i = 0; i < ${SCO_OS_STOP_TIMEOUT:-1} * 10; i++)); do
            mapfile -t left < <(live_groups "${groups[@]}")
            [ ${#left[@]} -eq 0 ] && break
            sleep 0.1
        done
        if [ ${#left[@]} -gt 0 ]; then
            log "sending KILL to groups still alive after ${SCO_OS_STOP_TIMEOUT:-1}s of TERM: ${left[*]}"
            for g in "${left[@]}"; do kill -KILL -- "-$g" 2>/dev/null || true; done
        fi
    fi
    # Anything that left its group but stayed in one of our sessions, or
    # carries our stack marker in its environment (e.g. an epmd spawned
    # by Erlang itself).
    local sids=" ${groups[*]} " stray=() f
    if [ ${#groups[@]} -gt 0 ]; then
        local line fields
        for p in /proc/[0-9]*/stat; do
            read -r line 2>/dev/null < "$p" || continue
            read -ra fields <<< "${line##*) }"
            [[ $sids == *" ${fields[3]} "* ]] || continue
            p=${p#/proc/}; stray+=("${p%/stat}")
        done
    fi
    while IFS= read -r f; do
        p=${f#/proc/}; p=${p%/environ}
        [ "$p" = $$ ] || [ "$p" = "$BASHPID" ] || stray+=("$p")
    done < <(grep -lzxF "SCO_OS_STACK_DIR=$DIR" /proc/[0-9]*/environ 2>/dev/null || true)
    if [ ${#stray[@]} -gt 0 ]; then
        kill -KILL "${stray[@]}" 2>/dev/null || true
    fi
    # Wait until nothing of ours runs any more (zombies awaiting their
    # reaper do not count).
    for ((i = 0; i < 50; i++)); do
        [ ${#groups[@]} -eq 0 ] || [ -z "$(live_groups "${groups[@]}")" ] && break
        sleep 0.1
    done
    # Orphans are reaped by init; give it up to 2 s so that `ps` is clean.
    for g in "${groups[@]}"; do
        for ((i = 0; i < 20; i++)); do kill -0 -- "-$g" 2>/dev/null || break; sleep 0.1; done
    done
    rm -f "$RUN"/*.pid
}

show_logs() {  # show_logs NAME...: tail of each service's logs to stderr
    local n f
    for n in "$@"; do
        for f in "$LOGS/$n.out" "$LOGS/$n.log" "$LOGS/$n"/*; do
            [ -s "$f" ] || continue
            printf '\n----- last lines of %s -----\n' "$f" >&2
            tail -n 40 "$f" >&2
        done
    done
}

fail() {  # fail MSG SVC...: report, show logs, tear down, exit 1
    local msg=$1; shift
    printf '[nova.sh] ERROR: %s\n' "$msg" >&2
    show_logs "$@"
    if [ "${SCO_OS_KEEP_ON_FAILURE:-0}" = 1 ]; then
        printf '[nova.sh] leaving the stack running (SCO_OS_KEEP_ON_FAILURE=1); run: %s down %s\n' "$0" "$DIR" >&2
    else
        kill_stack
    fi
    exit 1
}

on_abort() {  # `up` interrupted: stop the chains and whatever was started
    trap - INT TERM
    printf '[nova.sh] interrupted; stopping the half-started stack in %s\n' "$DIR" >&2
    [ ${#CHAIN_JOBS[@]} -eq 0 ] || kill "${CHAIN_JOBS[@]}" 2>/dev/null || true
    kill_stack
    exit 130
}
