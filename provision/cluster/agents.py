"""The cluster's agent processes: started from their rendered configs, found and stopped by
pidfile (a process is ours only if its command line names its config file)."""

from __future__ import annotations

from pathlib import Path

from provision.cluster import netns as ns
from provision.cluster import tls as cluster_tls
from provision.cluster.agent_config import ConfigDialect, render_agent_config
from provision.cluster.consul_binary import ConsulBinary
from provision.cluster.layout import AgentSpec, ClusterLayout
from provision.system.files import SECRET_MODE, write_atomically
from provision.system.processes import is_running, read_pid, spawn, stop
from provision.system.secrets import read_secret_file
from provision.system.templates import make_environment


def start_missing_agents(
    layout: ClusterLayout,
    missing: list[AgentSpec],
    binary: ConsulBinary,
    templates: Path,
    log_level: str,
) -> tuple[str, ...]:
    env = make_environment(templates)
    dialect = ConfigDialect.of(binary.version)
    gossip_key = cluster_tls.read_gossip_key(layout) if layout.tls else None
    replication = read_secret_file(layout.replication_token_file) if layout.secondary else None
    for agent in missing:  # servers first: the layout lists them first
        layout.data_dir(agent).mkdir(parents=True, exist_ok=True)
        config = render_agent_config(
            env,
            layout,
            agent,
            dialect,
            gossip_key=gossip_key,
            log_level=log_level,
            replication_token=replication,
        )
        # 0600: on a TLS cluster the config holds the gossip key, a secondary's server the
        # replication token (argv would show them to all).
        write_atomically(layout.config_file(agent), config, mode=SECRET_MODE)
        argv = [str(binary.path), "agent", f"-config-file={layout.config_file(agent)}"]
        if agent.netns is not None:
            argv = ns.exec_argv(agent.netns, argv)
        spawn(argv, layout.log_file(agent), layout.pidfile(agent))
    return tuple(agent.name for agent in missing)


def agent_running(layout: ClusterLayout, agent: AgentSpec) -> bool:
    pid = read_pid(layout.pidfile(agent))
    return pid is not None and is_running(pid, str(layout.config_file(agent)))


def stop_agents(layout: ClusterLayout, agents: list[AgentSpec]) -> tuple[str, ...]:
    by_pid = {}
    for agent in agents:
        pid = read_pid(layout.pidfile(agent))
        if pid is not None:
            by_pid[pid] = agent
    stopped = stop([(pid, str(layout.config_file(agent))) for pid, agent in by_pid.items()])
    for agent in agents:
        layout.pidfile(agent).unlink(missing_ok=True)
    return tuple(by_pid[pid].name for pid in stopped)
