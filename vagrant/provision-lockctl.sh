#!/bin/sh
# Guest provisioning, workers: install lockctl from the wheelhouse built on the host (the guests
# have no network), into /opt/lockctl, and the tick job the flow schedules; both came in the stage
# bundle provision-consul.sh unpacked. Worker configs, token files, lockctl's TLS files
# (/etc/lockctl/tls: ca.pem and the worker's pair, root's, the key 0600) and timers are delivered
# later, after `lockctl apply` (scripts/vagrant-verify).
# --no-compile: byte-compiling every module of the wheelhouse (pygments alone is thousands of
# files) is most of an install under software emulation; Python compiles what it imports.
set -eu
T0=$(date +%s)
STAGE=/tmp/lockctl-stage
PIP=$(ls /usr/share/python-wheels/pip-*.whl | head -n 1)
python3 -m venv --without-pip /opt/lockctl
/opt/lockctl/bin/python "$PIP/pip" install --quiet --no-index --no-compile --disable-pip-version-check \
  --find-links "$STAGE/wheelhouse" lockctl
ln -sf /opt/lockctl/bin/lockctl /usr/local/bin/lockctl
# ...but what `lockctl run` loads on every tick (the CLI, the runner, the Consul client) and
# `lockctl schedule` at its start is compiled now, by importing it once: the first tick then
# starts as fast as the later ones.
/opt/lockctl/bin/python -c 'import provision.cli, provision.consul, provision.runner.engine, provision.scheduler.service, provision.scheduler.listen'
install -m 0755 "$STAGE/tick-job" /usr/local/bin/lockctl-tick
install -d -m 0700 /etc/lockctl /etc/lockctl/tls
install -d -m 0755 /var/lib/lockctl-tick
rm -rf "$STAGE/wheelhouse" "$STAGE/tick-job"
echo "provision-lockctl: $(hostname): $(/usr/local/bin/lockctl --version) ($(( $(date +%s) - T0 )) s)"
