#!/bin/sh
# docker-compose one-shot: generate the development configuration the `gateway` service
# serves, into the `wiregate-dev` volume (mounted here at /var/lib/wiregate; the gateway
# mounts it read-only at /etc/wiregate/dev). Idempotent: an existing configuration is kept.
#
#   config/    `wiregate init` output: dev CA + certificate, signed example profiles (the
#              mock ones reach the mock provider on 127.0.0.1:9901, which shares the
#              gateway's network namespace), key ring, principals with the dev key
#   observe/   for Prometheus: an observe-only gateway key (`token`) and the dev CA
#              (`ca.pem`), mode 0640 group wiregate; Prometheus runs with that group
#
# The profile-signing private key that `wiregate init` writes beside config/ is deleted:
# the example profiles are signed already and the gateway must never see the key.
set -eu

root="${WIREGATE_DEV_ROOT:-/var/lib/wiregate}"
conf="$root/config"

if [ -f "$conf/wiregate.toml" ]; then
    echo "init-dev: $conf/wiregate.toml exists; keeping it"
    exit 0
fi

# The dev gateway key is printed once by init: keep it out of the compose logs. It is in
# $conf/dev-gateway-key (0600); read it with
#   docker compose exec gateway cat /etc/wiregate/dev/config/dev-gateway-key
wiregate init --dir "$conf" >/dev/null
rm -rf "$root/config-signing"

# Inside the compose network the gateway listens on every interface (Prometheus scrapes
# gateway:8443; the host publishes 127.0.0.1:8443 only); its socket goes to the tmpfs,
# since the configuration volume is mounted read-only. The mock provider is compose's own
# `mock-provider` service here (on the port the mock profiles name, in the gateway's network
# namespace), so the gateway does not serve it itself.
sed -i \
    -e 's|^host = "127.0.0.1"$|host = "0.0.0.0"|' \
    -e 's|^path = "run/wiregate.sock"$|path = "/run/wiregate/wiregate.sock"|' \
    -e 's|^enabled = true$|enabled = false|' \
    "$conf/wiregate.toml"
grep -q '^host = "0.0.0.0"$' "$conf/wiregate.toml"
grep -q '^path = "/run/wiregate/wiregate.sock"$' "$conf/wiregate.toml"
grep -q '^enabled = false$' "$conf/wiregate.toml"
rmdir "$conf/run" 2>/dev/null || true

# The context store and ledgers go to the compose file's PostgreSQL (the DSN, with its
# password, comes from the gateway's environment, never from this read-only volume).
cat >>"$conf/wiregate.toml" <<'EOF_STORE'

[store]
backend = "postgres"
dsn = "env:WIREGATE_STORE_DSN"
EOF_STORE

# Prometheus gets a key that may only read /metrics (action `observe`, no `proxy`).
umask 0027
mkdir -p "$root/observe"
wiregate principals add --id prometheus --profiles mock-openai --actions observe --config "$conf/wiregate.toml" \
    | sed -n 's/^gateway key (shown once): //p' >"$root/observe/token"
test -s "$root/observe/token"
cp "$conf/tls/ca.pem" "$root/observe/ca.pem"
chmod 0750 "$root/observe"
chmod 0640 "$root/observe/token" "$root/observe/ca.pem"
echo "init-dev: configuration written to $conf"
