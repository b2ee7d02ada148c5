"""Hostile input at the edges (issue 14, items 1 and 5): every one ends as one line on stderr and
exit 2, never a traceback, and a study already recorded is left as it was."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.errors import ConfigError
from autotune.report.load import StudyRef
from autotune.report.markdown import launch_command
from autotune.search.space import load_space
from autotune.search.storage import (
    STUDY_NAME_MAX,
    check_study_name,
    default_study_name,
    storage_url,
)
from autotune.specs.hardware import ClusterSpec, gpu_spec
from autotune.specs.model import ModelSpec
from autotune.specs.presets import load_model

STUDY = "kept"
MODEL_YAML = """name: tiny
num_layers: 2
hidden_size: 256
num_attention_heads: 4
vocab_size: 1000
seq_length: 128
global_batch_size: 8
"""
SEARCH = ["gpt2", "--gpus", "1", "--backend", "simulate", "--trials", "2"]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def snapshot(root: Path) -> dict[str, str]:
    """Every file under root with the SHA-256 of its bytes."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results folder with one planned study, STUDY."""
    root = tmp_path_factory.mktemp("results")
    assert main([*SEARCH, "--results-dir", str(root), "--study", STUDY]) == 0
    return root


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Input files with something wrong in each."""
    d = tmp_path_factory.mktemp("inputs")
    written = {
        "model_bytes": MODEL_YAML.replace("tiny", "tiny\udcff").encode("utf-8", "surrogateescape"),
        "model_newline": MODEL_YAML.replace("name: tiny", 'name: "tiny\\nrm -rf ~"').encode(),
        "model_cr": MODEL_YAML.replace("name: tiny", 'name: "tiny\\r# ok"').encode(),
        "model_long": MODEL_YAML.replace("name: tiny", "name: " + "m" * 150).encode(),
        "model_number": MODEL_YAML.replace("name: tiny", "name: 175").encode(),
        "space_bytes": b"tp: [1]\nmbs: [1, 2]  # \xfe\xff\n",
        "layout_bytes": b'{"tp": 1, "note": "\xff"}',
        "calibration_bytes": b'\x89PNG\r\n\x1a\n',
        "calibration_json": b'{"cost": ',
        "a_file": b"not a folder",
    }
    paths = {}
    for name, data in written.items():
        path = d / (name + (".yaml" if name.startswith(("model", "space")) else ".json"))
        path.write_bytes(data)
        paths[name] = path
    paths["dir"] = d
    return paths


STUDY_RULE = "a study name (a folder under --results-dir) is 1-100 letters"

# (id, arguments with {root}/{file:NAME}/{study_db} placeholders, a fragment of the one line)
HOSTILE: list[tuple[str, list[str], str]] = [
    # Item 1 / 5: study names, on every command that takes --study.
    ("newline", ["search", *SEARCH, "--study", "a\ntouch PWNED"], "contains '\\n'"),
    ("carriage-return", ["search", *SEARCH, "--study", "a\rb"], "contains '\\r'"),
    ("command-substitution", ["search", *SEARCH, "--study", "$(touch PWNED)"], "contains '$'"),
    ("backticks", ["search", *SEARCH, "--study", "x`touch PWNED`"], "contains '`'"),
    ("semicolon", ["search", *SEARCH, "--study", "x;touch PWNED"], "contains ';'"),
    ("single-quote", ["search", *SEARCH, "--study", "x'y"], "contains \"'\""),
    ("double-quote", ["search", *SEARCH, "--study", 'x"y'], "contains '\"'"),
    ("space", ["search", *SEARCH, "--study", "my study"], "contains ' '"),
    ("unicode", ["search", *SEARCH, "--study", "studie-ä"], "contains 'ä'"),
    ("300-chars", ["search", *SEARCH, "--study", "a" * 300], "has 300 characters"),
    ("101-chars", ["search", *SEARCH, "--study", "a" * 101], "has 101 characters"),
    ("empty", ["search", *SEARCH, "--study", ""], "--study is empty"),
    ("parent", ["search", *SEARCH, "--study", "../x"], "contains '/'"),
    ("absolute", ["search", *SEARCH, "--study", "/tmp/x"], "contains '/'"),
    ("dot", ["search", *SEARCH, "--study", "."], "starts with '.'"),
    ("dotdot", ["search", *SEARCH, "--study", ".."], "starts with '.'"),
    ("hidden", ["search", *SEARCH, "--study", ".x"], "starts with '.'"),
    ("dash", ["search", *SEARCH, "--study", "-x"], "starts with '-'"),
    ("report-parent", ["report", "--study", f"../{{root_name}}/{STUDY}"], "contains '/'"),
    ("report-dot", ["report", "--study", "."], "starts with '.'"),
    ("export-newline", ["export", "--format", "slurm", "--study", f"{STUDY}\nid"],
     "contains '\\n'"),
    ("export-absolute", ["export", "--format", "json", "--study", "{root}/" + STUDY],
     "contains '/'"),
    # Item 5: the results folder.
    ("results-dir-file", ["search", *SEARCH, "--results-dir", "{file:a_file}"],
     "is a file, not a folder"),
    ("results-dir-under-file", ["search", *SEARCH, "--results-dir", "{file:a_file}/sub"],
     "a_file.json is a file, not a folder"),
    ("report-results-dir-file", ["report", "--results-dir", "{file:a_file}"],
     "is a file, not a folder"),
    ("export-results-dir-file", ["export", "--format", "json", "--results-dir",
                                 "{file:a_file}"], "is a file, not a folder"),
    ("results-dir-newline", ["search", *SEARCH, "--results-dir", "{root}/a\nb"],
     "control character"),
    # Item 5: files that are not UTF-8, or not files.
    ("model-not-utf8", ["search", "{file:model_bytes}", "--gpus", "1", "--dry-run"],
     "is not UTF-8 text (byte 0xff"),
    ("estimate-model-not-utf8", ["estimate", "{file:model_bytes}", "--gpus", "1"],
     "is not UTF-8 text"),
    ("space-not-utf8", ["search", "gpt2", "--gpus", "1", "--space", "{file:space_bytes}",
                        "--dry-run"], "search space file"),
    ("layout-not-utf8", ["estimate", "gpt2", "--gpus", "1", "--layout", "{file:layout_bytes}"],
     "layout file"),
    ("layout-folder", ["estimate", "gpt2", "--gpus", "1", "--layout", "{file:dir}"],
     "is a folder, not a file"),
    ("calibration-not-utf8", ["estimate", "gpt2", "--gpus", "1", "--calibration",
                              "{file:calibration_bytes}"], "is not UTF-8 text (byte 0x89"),
    ("calibration-truncated", ["estimate", "gpt2", "--gpus", "1", "--calibration",
                               "{file:calibration_json}"], "malformed JSON"),
    ("calibration-folder", ["estimate", "gpt2", "--gpus", "1", "--calibration", "{file:dir}"],
     "is a folder, not a file"),
    ("search-calibration-not-utf8", [*SEARCH, "--calibration", "{file:calibration_bytes}"],
     "is not UTF-8 text"),
    # Item 1: a model's name is one printable line.
    ("model-name-newline", ["search", "{file:model_newline}", "--gpus", "1", "--dry-run"],
     "must be one line"),
    ("model-name-cr", ["estimate", "{file:model_cr}", "--gpus", "1"], "must be one line"),
    ("model-name-long", ["search", "{file:model_long}", "--gpus", "1", "--dry-run"],
     "at most 100 printable characters"),
    ("model-name-number", ["search", "{file:model_number}", "--gpus", "1", "--dry-run"],
     "name must be a string, got 175"),
    # Item 5: export -o.
    ("output-missing-folder", ["export", "--format", "json", "-o", "{root}/no/such/x.json"],
     "does not exist"),
    ("output-folder", ["export", "--format", "json", "-o", "{root}"], "is a folder"),
    ("output-study-db", ["export", "--format", "json", "-o", "{study_db}"],
     f"is a file of study {STUDY}; refusing to overwrite it"),
    ("output-study-db-relative", ["export", "--format", "slurm", "-o",
                                  f"{{root}}/{STUDY}/../{STUDY}/study.db"],
     "refusing to overwrite it"),
    ("output-study-journal", ["export", "--format", "json", "-o", "{study_db}-journal"],
     "refusing to overwrite it"),
    ("output-link-to-study-db", ["export", "--format", "json", "-o", "{link_to_db}"],
     "refusing to overwrite it"),
    ("output-hard-link-to-study-db", ["export", "--format", "json", "-o", "{hard_link}"],
     "refusing to overwrite it"),
    ("output-newline", ["export", "--format", "json", "-o", "{root}/a\nb.json"],
     "not a usable file name"),
    ("output-empty", ["export", "--format", "json", "-o", ""], "not a usable file name"),
    ("megatron-lm-newline", ["export", "--format", "megatron-lm", "--megatron-lm",
                             "/opt/M\ntouch PWNED"], "control character"),
    # Item 6: a raw '@' in a password is refused, not half printed.
    ("storage-raw-at", ["export", "--format", "json", "--storage",
                        "postgresql+psycopg://u:p@ss-word@localhost/db"], "percent-encoded"),
    ("storage-not-a-url", ["report", "--storage", "no url at all"], "is not a database URL"),
]

_NEEDS_RESULTS_DIR = ("report", "export")


def _fill(arg: str, root: Path, files: dict[str, Path]) -> str:
    for name, path in files.items():
        arg = arg.replace(f"{{file:{name}}}", str(path))
    study_db = root / STUDY / "study.db"
    return (arg.replace("{root_name}", root.name).replace("{root}", str(root))
            .replace("{study_db}", str(study_db))
            .replace("{link_to_db}", str(root.parent / "link.json"))
            .replace("{hard_link}", str(root.parent / "hard.json")))


@pytest.mark.parametrize(("args", "fragment"), [pytest.param(a, f, id=i) for i, a, f in HOSTILE])
def test_hostile_input_is_one_line_exit_2_and_the_study_is_intact(
        recorded: Path, files: dict[str, Path], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, args: list[str], fragment: str) -> None:
    monkeypatch.chdir(tmp_path)  # anything written relative to the working folder lands here
    link = recorded.parent / "link.json"
    if not link.is_symlink():
        link.symlink_to(recorded / STUDY / "study.db")
    hard = recorded.parent / "hard.json"
    if not hard.exists():
        os.link(recorded / STUDY / "study.db", hard)
    before = snapshot(recorded)
    argv = [_fill(a, recorded, files) for a in args]
    if argv[0] == "search":
        argv = argv[1:]  # the search is the default command: `autotune MODEL ...`
    if argv[0] == "estimate":
        pass
    elif argv[0] in _NEEDS_RESULTS_DIR and "--results-dir" not in argv:
        argv[1:1] = ["--results-dir", str(recorded)]
        if "--study" not in argv and "--storage" not in argv:
            argv[1:1] = ["--study", STUDY]
    elif "--results-dir" not in argv:
        argv += ["--results-dir", str(recorded)]
    code, out, err = run(capsys, *argv)
    assert code == 2, err
    assert out == ""
    assert err.startswith("autotune: error: ") and err.endswith("\n")
    assert len(err.splitlines()) == 1, err
    assert fragment in err
    assert "Traceback" not in err and "ss-word" not in err
    assert snapshot(recorded) == before  # nothing of the recorded study changed
    assert sorted(p.name for p in recorded.iterdir()) == [STUDY]  # nothing created beside it
    assert not (recorded.parent / "x").exists() and not list(tmp_path.iterdir())


def test_the_recorded_study_still_exports(recorded: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "export", "--results-dir", str(recorded), "--study", STUDY,
                         "--format", "json")
    assert code == 0, err
    assert f'"study": "{STUDY}"' in out


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
@pytest.mark.parametrize("command", [[*SEARCH], ["report", "--study", STUDY]])
def test_unwritable_results_dir(recorded: Path, tmp_path: Path,
                                capsys: pytest.CaptureFixture[str], command: list[str]) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / STUDY).symlink_to(recorded / STUDY)
    locked.chmod(0o555)
    try:
        code, _, err = run(capsys, *command, "--results-dir", str(locked))
    finally:
        locked.chmod(0o755)
    assert code == 2
    assert err.strip() == f"autotune: error: --results-dir {locked} is not writable"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_results_dir_that_cannot_be_created(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, *SEARCH, "--results-dir", "/proc/autotune-results")
    assert code == 2
    assert err.startswith("autotune: error: cannot create the study folder "
                          "/proc/autotune-results/")
    assert len(err.splitlines()) == 1


def test_export_writes_beside_the_study_but_never_over_it(
        recorded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    new = recorded / STUDY / "launch.sh"
    code, _, err = run(capsys, "export", "--results-dir", str(recorded), "--study", STUDY,
                       "--format", "megatron-lm", "-o", str(new))
    try:
        assert code == 0, err
        assert new.read_text().startswith("#!/usr/bin/env bash")
        code, _, err = run(capsys, "export", "--results-dir", str(recorded), "--study", STUDY,
                           "--format", "slurm", "-o", str(new))
        assert code == 2  # now it is a file of the study's folder
        assert "refusing to overwrite it" in err
    finally:
        new.unlink()
    elsewhere = tmp_path / "launch.sh"
    elsewhere.write_text("old")
    code, _, err = run(capsys, "export", "--results-dir", str(recorded), "--study", STUDY,
                       "--format", "megatron-lm", "-o", str(elsewhere))
    assert code == 0, err  # an ordinary file outside the study is overwritten, as asked
    assert elsewhere.read_text().startswith("#!/usr/bin/env bash")
    assert os.access(elsewhere, os.X_OK)


# -- study names: the rule, and the names autotune derives -----------------------------------


@pytest.mark.parametrize("name", ["gpt2-xl-8gpu-h100-80gb-worker-1a2b3c4d", "a", "A.b_c-9",
                                  "9" * STUDY_NAME_MAX, "v1..2"])
def test_safe_study_names_pass(name: str) -> None:
    assert check_study_name(name) == name


@pytest.mark.parametrize("name", ["", ".", "..", "../x", "a/b", "a\\b", "a b", "a\nb", "a\x00b",
                                  "$(id)", "`id`", "a;b", "a|b", "a&b", "a*", "~x", "-rf",
                                  "a\u2028b", "é", "9" * (STUDY_NAME_MAX + 1)])
def test_unsafe_study_names_are_refused_in_one_line(name: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_study_name(name)
    assert len(str(info.value).splitlines()) == 1


def test_storage_url_refuses_a_name_that_leaves_the_results_folder(tmp_path: Path) -> None:
    # A library caller (SearchConfig.study_name) reaches storage_url without the CLI's check.
    for name in ("../escape", "/abs", ".", "a\nb"):
        with pytest.raises(ConfigError):
            storage_url(tmp_path / "results", name, None)
        with pytest.raises(ConfigError):
            storage_url(tmp_path / "results", name, "postgresql://h/db")
    assert not (tmp_path / "escape").exists()


@pytest.mark.parametrize("model_name", ["my model (v2)", "x$(touch PWNED);`id`'\"", "../../etc",
                                        "ünïcödé", "...", "m" * 100, "gpt2"])
def test_default_study_names_are_safe(model_name: str) -> None:
    gpt2 = load_model("gpt2")
    model = ModelSpec(**{**{f: getattr(gpt2, f) for f in gpt2.__dataclass_fields__},
                         "name": model_name})
    cluster = ClusterSpec(num_gpus=8, gpus_per_node=8, gpu=gpu_spec("h100-80gb"))
    name = default_study_name(model, cluster, load_space(), "simulate")
    assert check_study_name(name) == name
    assert name.endswith("-8gpu-h100-80gb-simulate-" + name[-8:])
    if model_name == "gpt2":  # a preset's name is unchanged: its stored studies still resolve
        assert name.startswith("gpt2-8gpu-")


def test_a_hostile_model_name_gets_a_safe_study(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "evil.yaml"
    model.write_text(MODEL_YAML.replace("name: tiny", "name: \"x$(touch PWNED); `id` 'q\""))
    code, _, err = run(capsys, str(model), "--gpus", "1", "--backend", "simulate",
                       "--results-dir", str(tmp_path / "r"), "--trials", "2")
    assert code == 0, err
    (folder,) = (tmp_path / "r").iterdir()
    assert folder.name.startswith("x-touch-PWNED-id-q-1gpu-")
    assert check_study_name(folder.name) == folder.name


# -- report.md's "Launch it" line -------------------------------------------------------------


def _ref(root: Path, url: str | None = None) -> StudyRef:
    folder = root / STUDY
    return StudyRef(name=STUDY, url=url or f"sqlite:///{(folder / 'study.db').resolve()}",
                    folder=folder)


@pytest.mark.parametrize("root_name", ["plain", "with space", "it's", "$(touch PWNED)",
                                       "`touch PWNED`", "a;b&c|d"])
def test_launch_command_quotes_every_argument(tmp_path: Path, root_name: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import shlex

    monkeypatch.chdir(tmp_path)
    root = tmp_path / root_name
    command = launch_command(_ref(root))
    assert shlex.split(command) == ["autotune", "export", "--results-dir", str(root),
                                    "--study", STUDY, "--format", "megatron-lm"]
    assert launch_command(_ref(Path("results"))) == \
        f"autotune export --study {STUDY} --format megatron-lm"
    shared = launch_command(_ref(Path("results"), "postgresql://u:s3cret@db/optuna"))
    assert shlex.split(shared)[2:4] == ["--storage", "postgresql://u:***@db/optuna"]


def test_report_md_launch_line_runs_as_written(recorded: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import shlex

    pytest.importorskip("pandas")
    pytest.importorskip("matplotlib")
    pytest.importorskip("plotly")
    root = tmp_path / "odd `dir` $(x)"
    code, _, err = run(capsys, *SEARCH, "--results-dir", str(root), "--study", STUDY)
    assert code == 0, err
    assert run(capsys, "report", "--results-dir", str(root), "--study", STUDY)[0] == 0
    line = next(x for x in (root / STUDY / "report.md").read_text().splitlines()
                if x.startswith("Launch it: "))
    span = line.removeprefix("Launch it: ").split(" (or ")[0]
    fence = span[:len(span) - len(span.lstrip("`"))]
    command = span[len(fence):-len(fence)].strip(" ")
    argv = shlex.split(command)
    assert argv[:2] == ["autotune", "export"] and str(root) in argv
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, *argv[1:])
    assert code == 0, err
    assert out.startswith("#!/usr/bin/env bash")


def test_os_errors_left_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The last net at the edge: an OSError nobody turned into a message is still one line."""
    import autotune.commands.listing as listing

    def boom(*_: object, **__: object) -> None:
        raise PermissionError(13, "Permission denied", str(tmp_path / "x\ny"))

    monkeypatch.setattr(listing, "list_presets", boom)
    code, _, err = run(capsys, "models")
    assert code == 1
    assert err == f"autotune: error: Permission denied: {str(tmp_path / 'x') + chr(10) + 'y'!r}\n"



ADDED_MODEL_FIELDS = ("sliding_window", "kv_channels", "add_qkv_bias", "qk_layernorm",
                      "moe_shared_expert_intermediate_size", "moe_shared_expert_gate",
                      "multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim",
                      "qk_pos_emb_head_dim", "v_head_dim",
                      "rotary_percent", "apply_layernorm_1p", "moe_layer_freq",
                      "mtp_num_layers", "mtp_loss_scaling_factor")
"""ModelSpec fields added after studies were written (sessions 17-24)."""


@pytest.mark.parametrize("preset", ["llama3-8b", "gpt2-xl", "mixtral-8x7b"])
def test_a_model_field_added_later_keeps_the_study_name(preset: str) -> None:
    # Fields added to ModelSpec after studies were written: left out at the value every
    # earlier model had, the digest is the one computed without them, so `--resume` and a
    # rerun still find those studies.
    import hashlib
    import json
    from dataclasses import asdict

    model = load_model(preset)
    cluster = ClusterSpec(num_gpus=8, gpus_per_node=8, gpu=gpu_spec("h100-80gb"))
    space = load_space()
    before = {k: v for k, v in asdict(model).items() if k not in ADDED_MODEL_FIELDS}
    about = {"model": before, "gpus": 8, "per_node": 8, "gpu": "h100-80gb",
             "space": {k: list(v) for k, v in space.candidates.items()}, "backend": "simulate"}
    digest = hashlib.sha256(json.dumps(about, sort_keys=True, default=str).encode()).hexdigest()
    assert default_study_name(model, cluster, space, "simulate").endswith("-" + digest[:8])


@pytest.mark.parametrize(("field", "value"), [("add_qkv_bias", True), ("qk_layernorm", True),
                                              ("rotary_percent", 0.5),
                                              ("apply_layernorm_1p", True),
                                              ("mtp_num_layers", 1)])
def test_a_model_field_added_later_names_its_own_study_when_set(field: str,
                                                                value: object) -> None:
    import dataclasses

    model = load_model("llama3-8b")
    cluster = ClusterSpec(num_gpus=8, gpus_per_node=8, gpu=gpu_spec("h100-80gb"))
    space = load_space()
    changed = dataclasses.replace(model, **{field: value})
    assert default_study_name(changed, cluster, space, "simulate") != \
        default_study_name(model, cluster, space, "simulate")
