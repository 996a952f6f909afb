"""Each stage's DVC deps hold only the settings it reads (dvc.yaml; tests/test_dvc_yaml.py checks them against the
import closure): editing one section's settings module, its defaults or its rules, re-runs that section's stage
alone. Real ``dvc status`` and ``dvc repro`` on a private copy of the reproduced base repo."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import ALSO_READS, EMBEDDINGS, METRICS, STAGES, dvc, read_bytes, repro, set_params

pytestmark = pytest.mark.pipeline


def changed(repo: Path) -> dict[str, list]:
    """``dvc status --json``: each stage whose deps changed, and how."""
    return json.loads(dvc("status", "--json", cwd=repo).stdout or "{}")


@pytest.mark.parametrize("section", STAGES)
def test_a_sections_settings_module_is_a_dep_of_its_stage_alone(repo: Path, section: str) -> None:
    # each section's settings module lives in its stage's wing (recallk/<wing>/settings.py), a folder dep
    from stages.params import SECTIONS

    wing = SECTIONS[section].split(":")[0].rsplit(".", 1)[0].replace(".", "/")
    assert changed(repo) == {}
    module = repo / wing / "settings.py"
    module.write_text(module.read_text(encoding="utf-8") + "# edited\n", encoding="utf-8")
    status = changed(repo)
    readers = {stage for stage, sections in ALSO_READS.items() if section in sections}  # index reads score's
    assert set(status) == {section} | readers, status
    assert status[section] == [{"changed deps": {wing: "modified"}}], status


def test_an_encode_only_rule_change_reruns_encode_alone(repo: Path) -> None:
    """A tighter `encode.batch_size` bound (still met by the committed 64): encode re-runs, writes the same
    embeddings, so score is skipped; split never re-runs."""
    module = repo / "recallk" / "encode" / "settings.py"
    text = module.read_text(encoding="utf-8")
    rule = 'batch_size: int = setting(64, integer(1, 65536), "images per call of the backbone")'
    assert rule in text
    module.write_text(text.replace(rule, rule.replace("65536", "4096")), encoding="utf-8")
    assert set(changed(repo)) == {"encode"}
    before = read_bytes(repo, [EMBEDDINGS])
    ran, skipped, out = repro(repo)
    assert ran == {"encode"}, out
    assert skipped == {"split", "score", "index"}, out
    assert read_bytes(repo, [EMBEDDINGS]) == before


def test_split_background_is_a_param_of_split_and_encode(repo: Path) -> None:
    """`split.background` decides the pixels split hashes and encode embeds (docs/data.md#transparent-images): DVC
    sees it as a param of both (encode's params dep `split.background`, dvc.yaml), so neither is silently stale.
    The digits have no transparency, so their metrics stay as they were."""
    set_params(repo, {"split.background": "black"})
    status = changed(repo)
    assert set(status) == {"split", "encode"}, status
    assert status["encode"] == [{"changed deps": {"params.yaml": {"split.background": "modified"}}}], status
    before = read_bytes(repo, [METRICS])
    ran, _, out = repro(repo)
    assert {"split", "encode"} <= ran, out
    assert read_bytes(repo, [METRICS]) == before
