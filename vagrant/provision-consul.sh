#!/bin/sh
# Guest provisioning, every VM: unpack the stage bundle, install Consul and start its agent with
# the config lockctl rendered on the host (the Vagrantfile uploads /tmp/lockctl-stage/bundle.tar.gz;
# the flow has already put /etc/consul.d/agent.hcl and /etc/consul.d/tls/{ca.pem,NODE.pem,
# NODE-key.pem} in place, root-owned, key and config 0600: here they become the consul user's).
#   provision-consul.sh NODE_NAME binary|apt
# binary: the Consul binary copied from the host (in the bundle); works offline.
# apt:    HashiCorp's `consul` package; needs internet in the guest, CONSUL_APT_REPO="URL SUITE"
#         and CONSUL_APT_KEY (the path of the repository's key file in the guest).
set -eu
T0=$(date +%s)
NAME=$1
SOURCE=$2
STAGE=/tmp/lockctl-stage

tar -xzf "$STAGE/bundle.tar.gz" -C "$STAGE"
rm -f "$STAGE/bundle.tar.gz"

# The node's name: minbase has no D-Bus, so no hostnamectl.
echo "$NAME" >/etc/hostname
hostname "$NAME"
sed -i "s/^127\.0\.1\.1 .*/127.0.1.1 $NAME/" /etc/hosts

case "$SOURCE" in
  binary)
    install -m 0755 "$STAGE/consul" /usr/local/bin/consul
    ;;
  apt)
    [ -n "${CONSUL_APT_REPO:-}" ] && [ -n "${CONSUL_APT_KEY:-}" ] || {
      echo "provision-consul: apt needs CONSUL_APT_REPO and CONSUL_APT_KEY" >&2; exit 2; }
    echo "deb [signed-by=$CONSUL_APT_KEY] $CONSUL_APT_REPO main" >/etc/apt/sources.list.d/consul.list
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq consul >/dev/null
    ln -sf "$(command -v consul)" /usr/local/bin/consul
    ;;
  *) echo "provision-consul: unknown source $SOURCE" >&2; exit 2 ;;
esac

id consul >/dev/null 2>&1 || useradd --system --home-dir /var/lib/consul --shell /usr/sbin/nologin consul
install -d -o consul -g consul -m 0700 /var/lib/consul
TLS=/etc/consul.d/tls
for f in /etc/consul.d/agent.hcl "$TLS/ca.pem" "$TLS/$NAME.pem" "$TLS/$NAME-key.pem"; do
  [ -f "$f" ] || { echo "provision-consul: $f missing: the flow delivers it before provisioning" >&2; exit 2; }
done
# The agent reads its config (the gossip key) and its key as the consul user; nobody else can.
chown consul:consul /etc/consul.d/agent.hcl "$TLS" "$TLS/ca.pem" "$TLS/$NAME.pem" "$TLS/$NAME-key.pem"
chmod 0600 /etc/consul.d/agent.hcl "$TLS/$NAME-key.pem"
chmod 0700 "$TLS"
cat >/etc/systemd/system/consul.service <<'UNIT'
# Written by lockctl's vagrant/provision-consul.sh.
[Unit]
Description=Consul agent (config rendered by lockctl)
Wants=network-online.target
After=network-online.target

[Service]
User=consul
Group=consul
ExecStart=/usr/local/bin/consul agent -config-file=/etc/consul.d/agent.hcl
ExecReload=/bin/kill -HUP $MAINPID
KillSignal=SIGINT
Restart=on-failure
LimitNOFILE=65536

[Install]
WantedBy=multi-user.target
UNIT
systemctl daemon-reload
systemctl enable consul.service >/dev/null 2>&1
systemctl restart consul.service
rm -f "$STAGE/consul"

# Wait until the agent serves HTTPS on its cluster address, its certificate verified against the
# CA and its own pair presented (verify_incoming); the leader comes later: the other servers may
# still be booting.
ADDRESS=$(sed -n 's/^client_addr *= *"\(.*\)"/\1/p' /etc/consul.d/agent.hcl)
i=0
until curl -fsS -o /dev/null --cacert "$TLS/ca.pem" --cert "$TLS/$NAME.pem" --key "$TLS/$NAME-key.pem" \
    "https://$ADDRESS:8501/v1/status/leader"; do
  i=$((i + 1))
  [ $i -lt 120 ] || { journalctl -u consul --no-pager | tail -n 20; exit 1; }
  sleep 1
done
echo "provision-consul: $NAME: $(/usr/local/bin/consul version | head -n 1) serving HTTPS on $ADDRESS:8501; its key and config: $(stat -c '%a %U' "$TLS/$NAME-key.pem" /etc/consul.d/agent.hcl | sort -u | tr '\n' ' ')($(( $(date +%s) - T0 )) s)"
