"""docs/ci/: the GitHub Actions workflow and the GitLab job run a `recallk compare` this version accepts,
keep its exit code, and post the markdown it writes."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from recallk.compare import cli

DOCS = Path(__file__).resolve().parents[2] / "docs" / "ci"


def scripts(path: Path) -> list[str]:
    """Every shell line of a workflow (GitHub steps' `run`, GitLab's `script`)."""
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    if "jobs" in doc:
        return [step["run"] for job in doc["jobs"].values() for step in job["steps"] if "run" in step]
    return [line for job in doc.values() if isinstance(job, dict) for line in job.get("script", [])]


@pytest.mark.parametrize("name", ["github-compare.yml", "gitlab-compare.yml"])  # one per platform
def test_ci_example_runs_a_valid_gate_and_posts_its_markdown(name):
    lines = scripts(DOCS / name)
    command = next(s for s in lines if "recallk compare" in s)
    joined = command.replace("\\\n", " ").split("recallk compare", 1)[1]  # continuation lines joined
    words = shlex.split(joined.splitlines()[0].split(";")[0])
    args = cli.parser().parse_args(words)
    assert args.md == "comparison.md" and args.fail_if_worse
    assert all(cli.parse_gate(spec)[1] is not None for spec in args.fail_if_worse)  # margins, not plain gates
    text = "\n".join(lines)
    assert "comparison.md" in text.split("recallk compare", 1)[1].split("\n", 2)[-1]  # posted after the run
    assert ("gh pr comment" in text) if name.startswith("github") else ("cml comment" in text)
