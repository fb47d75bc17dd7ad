#!/bin/sh
# wiregate container entrypoint.
#
#   (no arguments) | serve [ARGS...]   wiregate serve --config "$WIREGATE_CONFIG" [ARGS...]
#   init | keys | profiles | principals | mock-provider ...   that wiregate subcommand
#   anything else                      run it as given (e.g. `wiregate mock-provider --port 9901`)
#
# `exec` replaces this shell, so the gateway is the process that receives SIGTERM (stop
# cleanly: in-flight calls get `shutdown_grace_s`), SIGINT and SIGHUP (atomic reload).
# Nothing here writes to the filesystem: the image runs with a read-only root.
set -eu

if [ "$#" -eq 0 ]; then
    set -- serve
fi

case "$1" in
    serve)
        shift
        config="${WIREGATE_CONFIG:-/etc/wiregate/config/wiregate.toml}"
        if [ ! -r "$config" ]; then
            echo "wiregate-entrypoint: no readable configuration at $config" >&2
            echo "wiregate-entrypoint: mount one there or set WIREGATE_CONFIG" >&2
            exit 78  # EX_CONFIG
        fi
        exec wiregate serve --config "$config" "$@"
        ;;
    init | keys | profiles | principals | mock-provider)
        exec wiregate "$@"
        ;;
    *)
        exec "$@"
        ;;
esac
