#!/usr/bin/env bash
# A throwaway PostgreSQL server for the shared-study tests (tests/test_postgres.py).
#
#   eval "$(.ci/postgres.sh start)"    # installs Debian's postgresql if needed, starts a cluster
#   ...                                # on 127.0.0.1, exports AUTOTUNE_TEST_POSTGRES_URL
#   .ci/postgres.sh stop               # stops it and deletes its folder (AUTOTUNE_PG_DIR)
#
# Only the export lines go to stdout (for eval); progress goes to stderr. The cluster lives in a
# temporary folder, listens on loopback only, on a free port, and has one database `autotune`
# owned by a user `autotune` with a random password.
set -euo pipefail

log() { echo "postgres.sh: $*" >&2; }

# As root, the server runs as the `postgres` user: initdb and postgres refuse to run as root.
as_owner() {
    if [ "$(id -u)" = 0 ]; then
        if command -v runuser >/dev/null 2>&1; then
            runuser -u postgres -- "$@"
        else
            su postgres -s /bin/sh -c "$(printf '%q ' "$@")"
        fi
    else
        "$@"
    fi
}

find_bin() {
    # Debian keeps the server binaries out of PATH, in /usr/lib/postgresql/<version>/bin.
    local dir
    if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
        dirname "$(readlink -f "$(command -v pg_ctl)")"
        return
    fi
    for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        if [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ]; then
            echo "$dir"
            return
        fi
    done
    return 1
}

install_postgres() {
    log "installing Debian's postgresql"
    local sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq >&2
    # The package's own cluster (postinst) is not used; ours lives in a temporary folder.
    $sudo apt-get install -y -qq postgresql >&2
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); \
print(s.getsockname()[1])'
}

start() {
    local bin dir port password
    bin="$(find_bin)" || { install_postgres; bin="$(find_bin)"; }
    dir="$(mktemp -d /tmp/autotune-pg.XXXXXX)"
    chmod 755 "$dir"  # the postgres user must reach its data folder below
    if [ "$(id -u)" = 0 ]; then chown postgres: "$dir"; fi
    password="$(python3 -c 'import secrets; print(secrets.token_hex(16))')"
    port="$(free_port)"
    printf '%s\n' "$password" >"$dir/pwfile"
    if [ "$(id -u)" = 0 ]; then chown postgres: "$dir/pwfile"; fi
    chmod 600 "$dir/pwfile"
    # Local (socket) connections trust the OS user, TCP ones need the password: the tests
    # connect over TCP with a URL that carries it, which is what the redaction test needs.
    as_owner "$bin/initdb" -D "$dir/data" -U postgres --auth-local=trust \
        --auth-host=scram-sha-256 -E UTF8 --no-locale >"$dir/initdb.log" 2>&1 \
        || { cat "$dir/initdb.log" >&2; exit 1; }
    rm -f "$dir/pwfile"
    # The socket goes in our folder (/var/run/postgresql may not exist or be writable);
    # max_connections leaves room for several searchers with a small pool each.
    as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
        -o "-h 127.0.0.1 -p $port -k $dir -c max_connections=200 -c fsync=off" start >&2 \
        || { cat "$dir/server.log" >&2; exit 1; }
    as_owner "$bin/psql" -h "$dir" -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 -q \
        -c "CREATE ROLE autotune LOGIN PASSWORD '$password'" \
        -c "CREATE DATABASE autotune OWNER autotune" >&2
    log "PostgreSQL $("$bin/pg_ctl" --version | awk '{print $3}') on 127.0.0.1:$port ($dir)"
    # SQLAlchemy's dialect for psycopg 3 (the `postgres` extra installs psycopg[binary]).
    echo "export AUTOTUNE_TEST_POSTGRES_URL=postgresql+psycopg://autotune:$password@127.0.0.1:$port/autotune"
    echo "export AUTOTUNE_PG_DIR=$dir"
    echo "export AUTOTUNE_PG_BIN=$bin"
}

stop() {
    local dir="${1:-${AUTOTUNE_PG_DIR:-}}" bin="${AUTOTUNE_PG_BIN:-}"
    if [ -z "$dir" ] || [ ! -d "$dir" ]; then
        log "nothing to stop"
        return 0
    fi
    [ -n "$bin" ] || bin="$(find_bin)"
    if [ -f "$dir/data/postmaster.pid" ]; then
        as_owner "$bin/pg_ctl" -D "$dir/data" -m immediate -w stop >&2 || true
    fi
    rm -rf "$dir"
    log "stopped and removed $dir"
}

case "${1:-}" in
    start) start ;;
    stop) stop "${2:-}" ;;
    *) echo "usage: $0 start | stop [DIR]" >&2; exit 2 ;;
esac
