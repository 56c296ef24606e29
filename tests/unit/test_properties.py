"""Property-based tests (hypothesis): whatever a user writes, an accepted spec renders policies
that grant the job's own prefix and the worker's own node, nothing else; and what is refused
never reaches the renderer (parse_spec raises, so there is no Spec to render)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from provision.acl.render import render_policies
from provision.spec import SpecError, parse_spec, prefix_problem
from provision.spec.hcl_parse import parse_hcl
from provision.system.templates import find_templates_dir

TEMPLATES = find_templates_dir()
# Plain characters, plus every character the spec must refuse or that HCL gives meaning to.
NASTY = "ab/._-AZ09 \t\n\"'`\\{}$%é*:#=[],\x00\x7f"
PLAIN_NAME = "abcz09-_"
text = st.text(alphabet=NASTY + PLAIN_NAME, max_size=24)
checks = settings(max_examples=400, deadline=None, database=None)


@checks
@given(st.text(alphabet=NASTY, max_size=16))
def test_an_accepted_prefix_is_plain(prefix: str) -> None:
    if prefix_problem(prefix) is None:
        assert prefix.endswith("/") and not prefix.startswith("/")
        assert ".." not in prefix and "//" not in prefix
        assert all(c.isascii() and (c.isalnum() or c in "._-/") for c in prefix)


@checks
@given(job=text, worker=text, prefix=text)
def test_accepted_specs_grant_only_their_prefix_and_node(
    job: str, worker: str, prefix: str
) -> None:
    """The strings go into the HCL verbatim, as a user's typo or an attack would."""
    try:
        spec = parse_spec(_spec_source(job, worker, prefix), "s.hcl")
    except SpecError:
        return  # refused: there is no Spec, so nothing can be rendered from it
    (parsed_job,) = spec.jobs
    assert (parsed_job.name, parsed_job.prefix, parsed_job.workers) == (job, prefix, (worker,))
    result = render_policies(spec, TEMPLATES)
    grants = {
        (block.type, block.labels[0].text, block.body.attributes[0].value)
        for policy in result.policies
        for block in parse_hcl(policy.rules).blocks
    }
    assert grants == {("key_prefix", prefix, "write"), ("session", worker, "write")}


@settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.filter_too_much],
)
@given(
    job=st.from_regex(r"[a-z0-9]([a-z0-9_-]{0,10}[a-z0-9])?", fullmatch=True),
    worker=st.from_regex(r"[a-z0-9]([a-z0-9_-]{0,10}[a-z0-9])?", fullmatch=True),
    prefix=st.from_regex(r"[A-Za-z0-9_-]{1,8}(/[A-Za-z0-9_-]{1,8}){0,3}/", fullmatch=True),
)
def test_well_formed_specs_are_accepted_and_render(job: str, worker: str, prefix: str) -> None:
    """The other half: the property above is not vacuous, plain input is accepted."""
    spec = parse_spec(_spec_source(job, worker, prefix), "s.hcl")
    names = {policy.name for policy in render_policies(spec, TEMPLATES).policies}
    assert names == {f"lock-{job}", f"session-{worker}"}


def _spec_source(job: str, worker: str, prefix: str) -> str:
    """A one-job spec with the strings written into the HCL verbatim."""
    return (
        f'worker "{worker}" {{}}\n'
        f'job "{job}" {{\n  prefix = "{prefix}"\n  workers = ["{worker}"]\n}}\n'
    )
