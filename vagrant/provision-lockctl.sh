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
# ...but lockctl's own package is compiled now (a hundred files: seconds, not minutes), and what
# `lockctl run` loads of its dependencies on every tick (requests, urllib3, ...) and `lockctl
# schedule` at its start is compiled by importing it once, so the first tick starts as fast as
# the later ones. The import is timed twice: the first compiles, the second is what a run pays.
SITE=$(/opt/lockctl/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
WARM='import provision.cli.entry, provision.cli.runjob, provision.cli.signals, provision.consul, provision.ledger.store, provision.runner.plain, provision.runner.on_core, provision.runner.precheck, provision.runner.metrics, provision.runner.tick_lock, provision.workers.config, provision.scheduler.service, provision.scheduler.on_core, provision.scheduler.listen'
ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
t=$(date +%s%N); /opt/lockctl/bin/python -m compileall -q "$SITE/provision"; COMPILE_MS=$(ms "$t")
t=$(date +%s%N); /opt/lockctl/bin/python -c "$WARM"; FIRST_MS=$(ms "$t")
t=$(date +%s%N); /opt/lockctl/bin/python -c "$WARM"; AGAIN_MS=$(ms "$t")
PYC=$(find /opt/lockctl -name '*.pyc' | wc -l)
install -m 0755 "$STAGE/tick-job" /usr/local/bin/lockctl-tick
install -d -m 0700 /etc/lockctl /etc/lockctl/tls
install -d -m 0755 /var/lib/lockctl-tick
rm -rf "$STAGE/wheelhouse" "$STAGE/tick-job"
echo "provision-lockctl: $(hostname): $(/usr/local/bin/lockctl --version) ($(( $(date +%s) - T0 )) s;" \
  "compile of provision ${COMPILE_MS} ms, first import ${FIRST_MS} ms, again ${AGAIN_MS} ms, $PYC .pyc)"
