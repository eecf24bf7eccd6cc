"""keystone-manage db_sync + bootstrap in one process (saves one ~1.5 s
interpreter start), and the fernet/credential key repositories written
directly (what fernet_setup/credential_setup do: keys 0 = staged, 1 = primary).

  keystone_db_setup.py CONFIG_FILE FERNET_DIR CREDENTIAL_DIR ADMIN_PASSWORD PUBLIC_URL
"""
import os
import sys

from cryptography.fernet import Fernet


def write_keys(d):
    os.makedirs(d, mode=0o700, exist_ok=True)
    os.chmod(d, 0o700)
    for i in ('0', '1'):
        fd = os.open(os.path.join(d, i), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, 'wb') as f:
            f.write(Fernet.generate_key())


def main():
    conf, fernet_dir, cred_dir, admin_pw, public_url = sys.argv[1:6]
    write_keys(fernet_dir)
    write_keys(cred_dir)
    from keystone.cmd import cli
    base = ['keystone-manage', '--config-file', conf]
    cli.main(argv=base + ['db_sync'])
    cli.CONF.clear()  # let cli.main() register its sub-command and parse again
    cli.main(argv=base + [
        'bootstrap', '--bootstrap-password', admin_pw,
        '--bootstrap-username', 'admin', '--bootstrap-project-name', 'admin',
        '--bootstrap-role-name', 'admin', '--bootstrap-service-name', 'keystone',
        '--bootstrap-region-id', 'RegionOne', '--bootstrap-public-url', public_url])


if __name__ == '__main__':
    main()
