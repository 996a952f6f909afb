"""Issue 39, index params: every `index.kinds` string, number and thread count is bounded at the params check
before FAISS or hnswlib sees it (FAISS's factory crashes the process on some strings: a segfault or an abort
is no error line), and a library failure while building, filling or searching an index is one message naming
the kind. The malformed kinds run in a subprocess, so that a crash shows as a signal exit."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from extras import extra
from helpers import assert_user_error, run_module
from recallk.errors import InputError
from recallk.index import kinds as kinds_mod
from recallk.index.inputs import exact_run, problem_of
from recallk.index.settings import IndexSettings, SweepSettings, index_settings
from recallk.index.sweep import score_index
from recallk.score.retrieval_data import RetrievalData
from recallk.score.settings import BootstrapSettings, ScoreSettings
from recallk.settings.base import as_params, checked

extra("faiss", "faiss")
extra("hnswlib", "hnswlib")

SCORE = ScoreSettings(ks=(1, 5), bootstrap=BootstrapSettings(resamples=0))
#: Every kind the docs, the tests and the bench use: the params check accepts each.
USED_KINDS = ["Flat", "IVF1024,Flat", "IVF1024,PQ32", "HNSW32", "HNSW8", "OPQ16,IVF256,PQ16", "IVF8,PQ4x4",
              "IVF4,Flat", "IVF16,Flat", "hnswlib", "hnswlib,M16", "hnswlib,M8", "hnswlib,M16,efc200"]


def index_errors(params: dict) -> list[str]:
    """The params check's sentences for an ``index`` section."""
    errors: list[str] = []
    checked(IndexSettings, params, "index", errors)
    return errors


def test_every_documented_kind_passes_the_params_check() -> None:
    assert index_errors({"kinds": USED_KINDS}) == []


@pytest.mark.parametrize("params, message", [
    # a seed FAISS keeps in a C int (2**70 was an OverflowError traceback at the build)
    ({"seed": 2**70}, r"`index.seed` must be an integer between 0 and 2147483647\. Got 1180591620717411303424"),
    ({"seed": 2**31}, r"`index.seed` must be an integer between 0 and 2147483647"),  # one past a C int
    # threads as build_threads takes them (2**40 was a traceback in omp_set_num_threads)
    ({"threads": 2**40}, r"`index.threads` must be an integer between 1 and 1024, or null"),
    ({"threads": 0}, r"`index.threads` must be an integer between 1 and 1024, or null"),  # no thread at all
    # efSearch beyond a C int was recorded as the operating point while FAISS held another number
    ({"sweep": {"efSearch": [16, 2**64]}}, r"`index.sweep.efSearch` must be distinct integers from 1 to 2147483647"),
    ({"sweep": {"ef": [2**31]}}, r"`index.sweep.ef` must be distinct integers from 1 to 2147483647"),  # hnswlib's
    ({"sweep": {"nprobe": [2**63]}}, r"`index.sweep.nprobe` must be distinct integers from 1"),  # FAISS's size_t
])
def test_numbers_are_bounded_at_the_params_check(params, message) -> None:
    errors = index_errors(params)
    assert len(errors) == 1, errors
    with pytest.raises(InputError, match=message):
        raise InputError(errors[0])


@pytest.mark.parametrize("params", [
    {"seed": 2**31 - 1, "threads": 1024, "build_threads": 1024},  # the largest of each
    {"threads": None, "sweep": {"efSearch": [1, 2**31 - 1], "ef": [2**31 - 1], "nprobe": [1]}},  # null: every core
])
def test_the_bounds_themselves_pass(params) -> None:
    assert index_errors(params) == []


#: (kind, what the params check says). Each crashed or failed the stage before: the crash is noted per row.
MALFORMED = [
    ("A" * 20_000, r"is 20000 characters long; a kind has at most 100"),  # SIGSEGV in FAISS's factory parser
    ("IVF8," * 4000 + "Flat", r"is 20004 characters long"),  # SIGSEGV (a long list of valid parts)
    ("HNSW0", r"M in 'HNSW0' must be 2 to 10000: FAISS crashes"),  # SIGABRT (an assertion) at the add
    ("HNSW1", r"M in 'HNSW1' must be 2 to 10000"),  # SIGSEGV at the add
    ("IVF8_HNSW1,Flat", r"M of its HNSW quantizer in 'IVF8_HNSW1' must be 2 to 10000"),  # SIGSEGV at the train
    ("IVF0,Flat", r"its lists \(nlist\) in 'IVF0' must be 1 to 4194304"),  # a traceback at the search
    ("IVF2147483647,Flat", r"its lists \(nlist\) in 'IVF2147483647' must be 1 to 4194304"),  # MemoryError traceback
    ("IVF8,PQ4x0", r"its bits per code in 'PQ4x0' must be 1 to 16: FAISS crashes on 0"),  # SIGFPE at the train
    ("PQ0", r"its sub-quantizers in 'PQ0' must be 1 to"),  # FAISS's own error, now refused before FAISS runs
    ("HNSW99999999999", r"M in 'HNSW99999999999' must be 2 to 10000"),  # "C++ exception stoi"
    ("IDMap,Flat", r"its part 'IDMap' is refused: an IDMap index takes the caller's ids"),  # a traceback at the add
    ("IDMap2,Flat", r"its part 'IDMap2' is refused"),  # the same
    ("NSG0", r"its part 'NSG0' is none of PCA<d>"),  # never returned: FAISS's NSG of 0 neighbours hangs the build
    ("LSH", r"its part 'LSH' is none of"),  # a kind outside the parts the stage builds
    ("IVF8", r"write at most 3 transforms .* Got IVF8 \(an IVF stage\)\."),  # an IVF stage without its codes
    ("Flat,HNSW8", r"Got Flat \(codes\), HNSW8 \(an HNSW graph\)\."),  # the parts out of order
    ("PCA8,PCA8,PCA8,PCA8,Flat", r"write at most 3 transforms"),  # too many transforms
    ("hnswlib,M1", r"'hnswlib,M1': M must be 2 to 10000"),  # a traceback at hnswlib's add
    ("hnswlib,M16,efc" + "9" * 20, r"efc \(ef_construction\) must be 1 to 2147483647"),  # beyond size_t: TypeError
    ("hnswlib,M", r"is not an hnswlib kind; write `hnswlib`"),  # hnswlib's syntax
]

#: Run in a subprocess per table: each kind through the params check the stage runs (stages.params on a
#: params.yaml) and, checked or not, through the Python API's parse_kind, build and search on 16-d rows. One
#: JSON line per kind; a crash (a signal) ends the process and names the kind it was on.
PROBE = textwrap.dedent("""
    import json, sys, tempfile, pathlib
    import numpy as np
    from recallk.errors import InputError
    from recallk.index import kinds
    from recallk.index.settings import IndexSettings
    from stages.params import load_settings

    rng = np.random.default_rng(0)
    rows = rng.normal(size=(300, 16)).astype(np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    folder = pathlib.Path(tempfile.mkdtemp())
    for name in json.loads(sys.stdin.read()):
        print(json.dumps({"on": name[:40]}), flush=True)
        result = {"name": name[:40]}
        (folder / "params.yaml").write_text(json.dumps({"index": {"kinds": [name]}}))
        try:
            load_settings(IndexSettings, folder / "params.yaml")
            result["params"] = "ok"
        except InputError as exc:
            result["params"] = str(exc)
        try:
            kind = kinds.parse_kind(name, 16)
            built = kinds.build(kind, rows, rows, 1, 0)
            kinds.search(built, rows[:20], 10, {}, 1)
            result["api"] = "ok"
        except InputError as exc:
            result["api"] = str(exc)
        print(json.dumps(result), flush=True)
""")


def probe(names: list[str]) -> dict[str, dict]:
    """Each kind of ``names`` through :data:`PROBE` in one subprocess: its results by name (cut to 40
    characters); the process must end by itself, with exit 0 and no traceback."""
    proc = subprocess.run([sys.executable, "-c", PROBE], input=json.dumps(names), capture_output=True, text=True,
                          timeout=600)
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    on = next((line["on"] for line in reversed(lines) if "on" in line), None)
    assert proc.returncode == 0, f"exit {proc.returncode} on {on!r}:\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr
    return {line["name"]: line for line in lines if "name" in line}


@pytest.fixture(scope="module")
def malformed_results() -> dict[str, dict]:
    return probe([name for name, _ in MALFORMED])


@pytest.mark.parametrize("name, message", MALFORMED, ids=[name[:24] for name, _ in MALFORMED])
def test_a_malformed_kind_is_one_error_and_no_crash(malformed_results, name, message) -> None:
    result = malformed_results[name[:40]]
    for path in ("params", "api"):  # the stage's params check, and the Python API without it
        with pytest.raises(InputError, match=r"`index.kinds` entry .*" + message):
            raise InputError(result[path])
    assert result["params"].startswith("invalid params.yaml:") and result["params"].count("\n  - ") == 1


#: (kind, what the API says on 16-d rows, or "ok"): the params check passes each; the extremes it allows build
#: and search without a crash, and what depends on the dimension or the rows is one message naming the kind.
EXTREMES = [
    ("HNSW2", "ok"),  # the smallest graph
    ("IVF1,Flat", "ok"),  # one list
    ("IVF1_HNSW2,PQ1x1", "ok"),  # an HNSW quantizer, one-bit codes of one sub-quantizer
    ("PCAWR4,OPQ2_4,PCA2,HNSW2,SQbf16,RFlat", "ok"),  # every role, three transforms
    ("IVF8,SQ4,RFlat", "ok"),  # an IVF stage re-ranked
    ("hnswlib,M2,efc1", "ok"),  # hnswlib's smallest
    ("hnswlib,M10000,efc2147483647", "ok"),  # hnswlib's largest
    ("IVF4194304,Flat", r"IVF4194304,Flat cannot train on 300 rows \(faiss: .*use fewer lists"),  # the most lists
    ("IVF8,PQ4x16", r"IVF8,PQ4x16 cannot train on 300 rows"),  # 2^16 centroids per codebook
    ("PCA32,Flat", r"PCA32 maps 16-d rows to 32-d; a transform keeps at most the dimensions it is given"),
    ("IVF8,PQ5", r"PQ5 splits 16-d rows into 5 sub-quantizers, which must divide 16"),  # FAISS refuses it at train
    ("PCA12,OPQ8,PQ4", r"OPQ8 splits 12-d rows into 8 sub-quantizers"),  # the width after the transform
    ("PCA12,OPQ4_8,HNSW8,PQ3", r"PQ3 splits 8-d rows into 3 sub-quantizers"),  # an OPQ's output width
]


def test_the_extremes_the_check_allows_build_or_fail_in_one_message() -> None:
    assert index_errors({"kinds": [name for name, _ in EXTREMES]}) == []
    results = probe([name for name, _ in EXTREMES])
    for name, expected in EXTREMES:
        result = results[name[:40]]
        assert result["params"] == "ok", result
        if expected == "ok":
            assert result["api"] == "ok", result
        else:
            with pytest.raises(InputError, match=r"`index.kinds`.*" + expected):
                raise InputError(result["api"])


@pytest.fixture(scope="module")
def rows() -> np.ndarray:
    rng = np.random.default_rng(1)
    out = rng.normal(size=(200, 16)).astype(np.float32)
    return out / np.linalg.norm(out, axis=1, keepdims=True)


# A Kind made directly (the params check and parse_kind refuse these strings) reaches the library's own failure:
# each was a RuntimeError traceback from FAISS's or hnswlib's add or search, now one message naming the kind.
@pytest.mark.parametrize("kind, message", [
    (kinds_mod.Kind("IDMap,Flat", "faiss", {}, False, 16),  # FAISS refuses add without ids
     r"`index.kinds`: IDMap,Flat cannot add 200 rows \(faiss: .*add_with_ids.*\); use a smaller kind"),
    (kinds_mod.Kind("IVF0,Flat", "faiss", {}, False, 16),  # FAISS fills it, then fails every search
     r"`index.kinds`: IVF0,Flat cannot search 20 queries for 5 items at its defaults \(faiss: .*\); use another"),
    # hnswlib cannot link a graph of M 1
    (kinds_mod.Kind("hnswlib,M1", "hnswlib", {"ef": None}, False, 16, m=1),
     r"`index.kinds`: hnswlib,M1 cannot add 200 rows \(hnswlib: Not enough memory"),
])
def test_add_and_search_failures_are_one_message(rows, kind, message) -> None:
    with pytest.raises(InputError, match=message):
        built = kinds_mod.build(kind, rows, rows, 1, 0)
        kinds_mod.search(built, rows[:20], 5, {}, 1)


def test_nprobe_beyond_a_kinds_lists_is_refused_where_the_kind_is_made() -> None:
    # The one sweep bound that depends on the kind (its nlist) is checked at use time, by points alone.
    with pytest.raises(InputError, match=r"`index.sweep.nprobe`: IVF8,Flat has 8 lists \(nlist\), so nprobe can be "
                                         r"1 to 8\. Got 16 instead"):
        kinds_mod.points(kinds_mod.parse_kind("IVF8,Flat", 16), {"nprobe": (16,)})


@pytest.fixture(scope="module")
def tiny(rows):
    """A retrieval problem on :func:`rows` and its exact run, for :func:`score_index`."""
    labels = np.arange(len(rows)) % 4
    data = RetrievalData(rows[:20], rows, labels[:20], labels)
    return problem_of(data), exact_run(data, SCORE)


# IndexSettings made in Python skip the params check; score_index checks them once, by the params check's route
# (index_settings), before anything is built. A seed, thread count or operating point beyond what FAISS and
# hnswlib take (C ints) was an OverflowError or TypeError traceback from their bindings; now the params check's
# sentence, the one each rule has (kinds.py checks only what depends on the kind or the data).
@pytest.mark.parametrize("settings, message", [
    (IndexSettings(kinds=("IVF8,Flat",), seed=2**70),  # FAISS's k-means
     r"`index.seed` must be an integer between 0 and 2147483647\. Got 1180591620717411303424"),
    (IndexSettings(kinds=("hnswlib",), seed=-1), r"`index.seed` must be an integer between 0"),  # hnswlib's levels
    (IndexSettings(kinds=("Flat",), build_threads=2**40),  # the build
     r"`index.build_threads` must be an integer between 1 and 1024"),
    (IndexSettings(kinds=("hnswlib",), threads=2**40),  # the search: the params' bound, 1024, not a C int's
     r"`index.threads` must be an integer between 1 and 1024, or null"),
    (IndexSettings(kinds=("HNSW8",), sweep=SweepSettings(efSearch=(16, 2**64))),  # FAISS's
     r"`index.sweep.efSearch` must be distinct integers from 1 to 2147483647"),
    (IndexSettings(kinds=("hnswlib",), sweep=SweepSettings(ef=(2**31,))),  # hnswlib's
     r"`index.sweep.ef` must be distinct integers from 1 to 2147483647"),
    (IndexSettings(kinds=("HNSW0",)), r"`index.kinds` entry 'HNSW0': M in 'HNSW0' must be 2 to 10000"),
    (IndexSettings(kinds=("Flat",), threads=0, seed=-1),  # every problem, in one error
     r"^`index.threads` must be .* `index.seed` must be an integer between 0"),
])
def test_settings_made_in_python_meet_the_params_rules(tiny, monkeypatch, settings, message) -> None:
    problem, exact = tiny
    monkeypatch.setattr(kinds_mod, "build", lambda *args: pytest.fail("built before the settings were checked"))
    with pytest.raises(InputError, match=message) as caught:
        score_index(problem, exact, settings, SCORE)
    assert str(caught.value) == " ".join(index_errors(as_params(settings)))  # the params check's sentences
    with pytest.raises(InputError, match=message):
        index_settings(settings)


def test_checked_settings_are_the_params_checks_object() -> None:
    # Lists given in Python become tuples, a sub-section given as a mapping its settings class, as from params.yaml.
    settings = IndexSettings(kinds=["HNSW8"], sweep={"efSearch": [16, 64]}, threads=4)
    assert index_settings(settings) == IndexSettings(kinds=("HNSW8",), sweep=SweepSettings(efSearch=(16, 64)),
                                                     threads=4)
    assert index_settings() == IndexSettings()


def test_the_largest_efsearch_runs_as_the_gallery_size() -> None:
    # efSearch 2^31 - 1 passes the params check; FAISS would fill a candidate list of that many entries per query
    # (16 GiB: bad_alloc, or the OOM killer). In a subprocess whose address space is capped at 8 GiB, so that the
    # test cannot exhaust the machine: the answers are those at efSearch = the gallery size, the same search.
    code = textwrap.dedent("""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))
        import numpy as np
        from recallk.index import kinds
        rows = np.random.default_rng(0).normal(size=(300, 16)).astype(np.float32)
        rows /= np.linalg.norm(rows, axis=1, keepdims=True)
        built = kinds.build(kinds.parse_kind("HNSW8", 16), rows, rows, 1, 0)
        huge = kinds.search(built, rows[:50], 10, {"efSearch": 2**31 - 1}, 1)
        full = kinds.search(built, rows[:50], 10, {"efSearch": 300}, 1)
        assert np.array_equal(huge[0], full[0]) and np.array_equal(huge[1], full[1])
        print(huge[3])
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "{'efSearch': 2147483647}"  # the operating point as swept: the same search


@pytest.mark.stage
def test_the_stage_refuses_the_longest_kind_in_one_line(tmp_path) -> None:
    # The real stage on the 20 KB kind that segfaulted it: exit 2, one error line, no traceback, no output.
    (tmp_path / "params.yaml").write_text(json.dumps({"index": {"kinds": ["A" * 20_000, "HNSW0"]}}))
    proc = run_module("stages.index", cwd=tmp_path)
    assert_user_error(proc, "is 20000 characters long; a kind has at most 100")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]
