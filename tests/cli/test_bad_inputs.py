"""The catalogue of bad inputs: each ends in one line naming the problem, exit 2, no traceback.

Every case builds its own broken input in a temporary folder. `--debug` on any of them shows the
traceback (checked once at the end). Ctrl-C mid-run exits 130 and leaves no file behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from headscope.cli import app
from headscope.models import bundled_path

runner = CliRunner()
TOY = Path(__file__).resolve().parents[1] / "toy" / "model"


def write(path: Path, data: bytes | str) -> Path:
    if isinstance(data, str):
        data = data.encode("utf-8")
    path.write_bytes(data)
    return path


CONLLU_OK = "1\tthe\t_\t_\t_\t_\t2\tdet\t_\t_\n2\tdog\t_\t_\t_\t_\t0\troot\t_\t_\n\n"
ZERO_WIDTH_SET = 'items:\n- text: "\\u200b\\u200b"\n- text: hello world\n'
SCAN_HEADER = "model,detector,relation,direction,layer,head,score\n"
NEEDLE_BAD = (
    "items:\n"
    "- id: n1\n"
    "  needle: The code of the red door is 123456.\n"
    "  question: What is the code of the red door?\n"
    "  answer: '654321'\n"
)
NEEDLE_OCTAL = "items:\n- id: n1\n  needle: The code is 010.\n  question: What is the code?\n  answer: 010\n"
# A raw U+2028 inside a JSON string is valid JSONL: the bad item is still on line 2.
NEEDLES_SEPARATOR = (
    '{"id": "a", "needle": "The code\u2028 of the door is 123.", "question": "Code?", "answer": "123"}\n'
    '{"id": "b", "needle": "The code of the gate is 456.", "question": "Code?", "answer": "999"}\n'
)
NEEDLE_HUGE = (
    '{"id": "h", "needle": "The code is 1.", "question": "Code?", "answer": "' + "9" * 1_000_000 + '"}\n'
)
TASKS_NAMED = "name: days\ntasks:\n  - name: t\n    members: {members}\n"
IOI_MISSING = (
    '{"id": "a", "text": "When Mary and John went out, John gave a book to", "io": "Mary", "s": "John"}\n'
    '{"id": "b", "text": "When Annabel and John went out, John gave a book to", "io": "Anna", "s": "John"}\n'
)
IOI_ONCE = (
    "items:\n- id: once\n  text: When Mary and John went out, Bob gave a book to\n  io: Mary\n  s: John\n"
)
COREF_TWO = "items:\n- text: Tom saw Ann and he ran\n  pronoun: [16, 18]\n  candidates:\n  - [0, 3]\n  - {second}\n  antecedent: {antecedent}\n"


def _unnumbered(d: Path) -> Path:
    root = d / "run"
    for name in ("step-1", "latest"):
        (root / name).mkdir(parents=True)
        (root / name / "config.json").write_text("{}")
    return root


def case_files(d: Path) -> dict[str, tuple[list, str]]:
    """id -> (arguments, text the error line must contain)."""
    gguf = bundled_path("smollm2-135m")
    truncated = d / "truncated.gguf"
    with gguf.open("rb") as source:
        truncated.write_bytes(source.read(3_000_000))
    (d / "notmodel").mkdir()
    write(d / "notmodel" / "weights.txt", "not a model")
    write(d / "exists.csv", "keep me\n")
    return {
        # files: missing, empty, binary, malformed or truncated, wrong encoding
        "text-missing": (["scan", TOY, "--text", d / "missing.yaml"], "missing.yaml: file not found"),
        "text-empty": (["scan", TOY, "--text", write(d / "empty.yaml", "")], "empty.yaml: file is empty"),
        "text-binary": (["scan", TOY, "--text", write(d / "bin.txt", b"ab\x00\x01")], "binary file"),
        "yaml-malformed": (
            ["scan", TOY, "--text", write(d / "bad.yaml", "items:\n  - text: a b\n   - text: c\n")],
            "bad.yaml:3: malformed YAML",
        ),
        "yaml-truncated": (
            ["scan", TOY, "--text", write(d / "cut.yaml", 'items:\n  - text: "abc\n')],
            "cut.yaml:3: malformed YAML",
        ),
        "jsonl-malformed": (
            ["scan", TOY, "--text", write(d / "bad.jsonl", '{"text": "a b"}\n{bad\n')],
            "bad.jsonl:2: malformed JSON",
        ),
        "jsonl-truncated": (
            ["scan", TOY, "--text", write(d / "cut.jsonl", '{"text": "a b"}\n{"text": "c')],
            "cut.jsonl:2: malformed JSON",
        ),
        "text-latin1": (
            ["scan", TOY, "--text", write(d / "latin1.txt", b"caf\xe9 au lait\n")],
            "latin1.txt:1: not valid UTF-8",
        ),
        "conllu-columns": (
            ["syntax", TOY, "--treebank", write(d / "cols.conllu", "1\tthe\t_\t_\t_\t_\t2\tdet\n")],
            "cols.conllu:1: expected 10 tab-separated columns, found 8",
        ),
        "conllu-truncated": (
            ["syntax", TOY, "--treebank", write(d / "cut.conllu", CONLLU_OK + "1\tthe\t_\t_")],
            "cut.conllu:4: expected 10 tab-separated columns, found 4",
        ),
        "conllu-head-out-of-range": (
            [
                "syntax",
                TOY,
                "--treebank",
                write(d / "head.conllu", CONLLU_OK.replace("\t2\tdet", "\t7\tdet")),
            ],
            "head.conllu:1: HEAD 7 points outside the sentence",
        ),
        "conllu-empty": (
            ["syntax", TOY, "--treebank", write(d / "empty.conllu", "\n\n")],
            "empty.conllu: file is empty",
        ),
        "coref-span-out-of-range": (
            [
                "coref",
                TOY,
                "--data",
                write(d / "span.yaml", COREF_TWO.format(second="[8, 99]", antecedent=0)),
            ],
            "span.yaml:2: candidate 1 [8, 99) is outside the text",
        ),
        "coref-antecedent-out-of-range": (
            [
                "coref",
                TOY,
                "--data",
                write(d / "ante.yaml", COREF_TWO.format(second="[8, 11]", antecedent=5)),
            ],
            "'antecedent' must be an index into 'candidates' (0..1), got 5",
        ),
        "csv-missing-columns": (
            ["compare", write(d / "cols.csv", "model,layer\nm,0\n"), d / "cols.csv"],
            "cols.csv:1: missing column(s)",
        ),
        "csv-truncated": (
            ["compare", write(d / "cut.csv", SCAN_HEADER + "m,ind,,,0,0,0.5\nm,ind,,,0"), d / "cut.csv"],
            "cut.csv:3: 5 fields, the header has 7",
        ),
        "csv-empty": (["compare", write(d / "empty.csv", ""), d / "empty.csv"], "empty.csv: empty file"),
        "csv-latin1": (
            [
                "compare",
                write(d / "latin.csv", SCAN_HEADER.encode() + b"m\xe9,ind,,,0,0,0.5\n"),
                d / "latin.csv",
            ],
            "latin.csv:2: not UTF-8",
        ),
        "csv-missing": (["compare", d / "nope.csv", d / "nope.csv"], "nope.csv: no such file"),
        # text that tokenizes to nothing, or beyond the context
        "text-nothing": (["show", TOY, "--text", "   "], "--text is empty"),
        "text-tokenizes-to-nothing": (
            ["show", "minilm-l6", "--text", "\u200b\u200b"],
            "tokenizes to no content tokens",
        ),
        "text-set-item-tokenizes-to-nothing": (
            ["scan", "minilm-l6", "--detectors", "sink", "--text", write(d / "zw.yaml", ZERO_WIDTH_SET)],
            "zw.yaml:2: item 'zw-1' tokenizes to nothing",
        ),
        "text-beyond-context": (
            ["show", TOY, "--text", " ".join(["t1"] * 300)],
            "--text is 300 tokens, longer than the model's context of 128 tokens",
        ),
        "sequence-beyond-context": (["induction", TOY, "--seq-len", 100], "context of 128"),
        # layer or head out of range
        "layer-out-of-range": (
            ["show", TOY, "--layer", 5],
            "--layer 5 is out of range: this model has layers 0..1",
        ),
        "head-out-of-range": (
            ["show", TOY, "--head", 4],
            "--head 4 is out of range: this model has heads 0..3",
        ),
        "head-not-a-number": (["show", TOY, "--head", "1,x"], "'x' is not a head number"),
        # unknown detector or relation
        "unknown-detector": (["scan", TOY, "--detectors", "previous-token,foo"], "unknown detector foo"),
        "unknown-relation": (
            ["syntax", TOY, "--treebank", write(d / "ok.conllu", CONLLU_OK), "--relations", "nsubj"],
            "--relations: nsubj not found in",
        ),
        # models that are not models
        "model-not-a-model": (["scan", d / "notmodel"], "without config.json"),
        "model-corrupt-gguf": (["info", write(d / "corrupt.gguf", os.urandom(4096))], "not a GGUF file"),
        "model-truncated-gguf": (["info", truncated], "cannot read GGUF file"),
        "model-unknown": (["info", "no-such-model"], "model 'no-such-model' not found"),
        # output paths
        "output-unwritable": (
            ["scan", TOY, "--csv", "/proc/headscope.csv"],
            "--csv /proc/headscope.csv: cannot write",
        ),
        "output-directory": (["induction", TOY, "-o", d], "is a directory"),
        "output-missing-folder": (["induction", TOY, "--csv", d / "no" / "x.csv"], "does not exist"),
        "output-exists": (["induction", TOY, "--csv", d / "exists.csv"], "file exists (add --force"),
        "png-exists": (
            ["show", TOY, "--text", "t1 t2", "--png", d / "exists.csv"],
            "exists.csv: file exists",
        ),
        "output-parent-is-a-file": (
            ["info", TOY, "-o", d / "exists.csv" / "info.txt"],
            "exists.csv is a file, not a folder",
        ),
        "output-name-too-long": (
            ["info", TOY, "--format", "json", "-o", d / ("n" * 300 + ".json")],
            "file name too long for the file system",
        ),
        "csv-name-too-long": (
            ["induction", TOY, "--csv", d / ("c" * 300 + ".csv")],
            "--csv",
        ),
        "png-name-too-long": (
            ["show", TOY, "--text", "t1 t2", "--png", d / ("p" * 300 + ".png")],
            "file name too long",
        ),
        "folder-name-too-long": (
            ["induction", TOY, "--csv", d / ("f" * 300) / "x.csv"],
            "file name too long",
        ),
        # circuit analyses: needles, IOI prompts, placement options, encoders
        "needle-answer-not-in-needle": (
            ["retrieval", TOY, "--data", write(d / "needles.yaml", NEEDLE_BAD)],
            "needles.yaml:2: item 'n1': 'answer' ('654321') does not occur in 'needle'",
        ),
        "ioi-name-missing": (
            ["ioi", TOY, "--data", write(d / "ioi-missing.jsonl", IOI_MISSING)],
            "ioi-missing.jsonl:2: item 'b': 'io' (\"Anna\") does not occur in 'text'",
        ),
        "ioi-s-not-repeated": (
            ["ioi", TOY, "--data", write(d / "ioi-once.yaml", IOI_ONCE)],
            "ioi-once.yaml:2: item 'once': 's' (\"John\") must occur at least twice",
        ),
        "context-beyond-model": (
            ["retrieval", TOY, "--context", "1000"],
            "--context 1000 is longer than the model's context of 128 tokens",
        ),
        "context-repeated": (
            ["retrieval", TOY, "--context", "100,200,100"],
            "--context 100,200,100: 100 is given twice",
        ),
        "depths-repeated": (
            ["retrieval", TOY, "--depths", "0,0.5,1,.5"],
            "--depths 0,0.5,1,.5: .5 (= 0.5) is given twice",
        ),
        "context-empty": (["retrieval", TOY, "--context", ","], "--context ,: the list is empty"),
        "needle-answer-octal": (
            ["retrieval", TOY, "--data", write(d / "octal.yaml", NEEDLE_OCTAL)],
            "octal.yaml:2: item 'n1': 'answer' must be a non-empty string, got 010, which YAML read as "
            'the number 8 (quote it: "010")',
        ),
        "needle-jsonl-line-separator": (
            ["retrieval", TOY, "--data", write(d / "sep.jsonl", NEEDLES_SEPARATOR)],
            "sep.jsonl:2: item 'b': 'answer' ('999') does not occur in 'needle'",
        ),
        "needle-huge-field": (
            ["retrieval", TOY, "--data", write(d / "huge.jsonl", NEEDLE_HUGE)],
            "huge.jsonl:1: item 'h': 'answer' ('",
        ),
        # data files are read and checked before any model loads: the model here does not exist
        "needles-before-the-model": (
            ["retrieval", d / "no-such-model", "--data", d / "needles.yaml"],
            "needles.yaml:2: item 'n1'",
        ),
        "ioi-before-the-model": (
            ["ioi", d / "no-such-model", "--data", d / "ioi-once.yaml"],
            "ioi-once.yaml:2: item 'once'",
        ),
        "tasks-before-the-model": (
            ["weights", d / "no-such-model", "--tasks", d / "tasks-short.yaml"],
            "tasks-short.yaml:3",
        ),
        "treebank-before-the-model": (
            ["syntax", d / "no-such-model", "--treebank", d / "cols.conllu"],
            "cols.conllu:1: expected 10 tab-separated columns",
        ),
        "text-before-the-model": (["scan", d / "no-such-model", "--text", d / "bad.yaml"], "bad.yaml:3"),
        "depths-before-the-model": (
            ["retrieval", d / "no-such-model", "--depths", "1,1"],
            "--depths 1,1: 1 is given twice",
        ),
        "depths-outside-0-1": (
            ["retrieval", TOY, "--depths", "0,0.5,1.5"],
            "--depths 0,0.5,1.5: every depth must lie between 0 and 1",
        ),
        "retrieval-on-an-encoder": (["retrieval", "minilm-l6"], "is not a causal language model"),
        "ioi-on-an-encoder": (["ioi", "minilm-l6"], "needs a causal language model"),
        # kv-plan: sparsities, the window, the context, the model kind, the output folder
        "kv-sparsity-before-the-model": (
            ["kv-plan", d / "no-such-model", "--sparsity", "0.5,1.5"],
            "--sparsity 0.5,1.5: 1.5 is outside [0, 1]",
        ),
        "kv-sparsity-not-a-number": (
            ["kv-plan", TOY, "--sparsity", "half"],
            "--sparsity half: half is not a number",
        ),
        "kv-window-before-the-model": (
            ["kv-plan", d / "no-such-model", "--sink", "64", "--recent", "256", "--context", "300"],
            "--sink 64 + --recent 256 = 320 tokens covers the whole --context 300",
        ),
        "kv-context-beyond-model": (
            ["kv-plan", TOY, "--context", "1000", "--sink", "4", "--recent", "16"],
            "--context 1000 is longer than",
        ),
        "kv-plan-on-an-encoder": (["kv-plan", "minilm-l6"], "is not a causal language model"),
        "kv-out-file-before-the-model": (
            ["kv-plan", d / "no-such-model", "--out", write(d / "plan-file", "x")],
            "is a file, not a folder",
        ),
        # the HTML report
        "report-not-headscopes": (
            ["report", write(d / "other.json", '{"name": "not ours"}'), "--html", d / "r1.html"],
            "other.json: not a headscope result",
        ),
        "report-truncated": (
            [
                "report",
                write(d / "cut.json", '{"headscope": "0.1", "rows": [{"layer": 0'),
                "--html",
                d / "r2.html",
            ],
            "cut.json:1: not valid JSON",
        ),
        "report-html-exists": (
            ["report", write(d / "other2.json", "{}"), "--html", write(d / "exists.html", "keep me\n")],
            "exists.html: file exists",
        ),
        # sweeps
        "sweep-unknown-analysis": (
            ["sweep", TOY, "--out", d / "store-a", "--analysis", "induction,nope"],
            "--analysis nope: unknown analysis",
        ),
        "sweep-unnumbered-checkpoint": (
            ["sweep", _unnumbered(d), "--out", d / "store-b"],
            "checkpoint folder 'latest' has no number in its name",
        ),
        # weight-only roles: options and ordinal task files
        "weights-k-zero": (["weights", TOY, "--k", "0"], "--k must be at least 1, got 0"),
        "weights-tokens-zero": (["weights", TOY, "--tokens", "0"], "--tokens must be at least 1, got 0"),
        "weights-unknown-embedding": (
            ["weights", TOY, "--embedding", "mlp1"],
            "--embedding must be raw or mlp0, got 'mlp1'",
        ),
        "weights-tasks-empty": (
            ["weights", TOY, "--tasks", write(d / "tasks-empty.yaml", "")],
            "tasks-empty.yaml",
        ),
        "weights-tasks-malformed": (
            [
                "weights",
                TOY,
                "--tasks",
                write(d / "tasks-bad.yaml", "tasks:\n  - name: days\n    members: [Mon, Tue\n"),
            ],
            "tasks-bad.yaml",
        ),
        "weights-task-too-short": (
            [
                "weights",
                TOY,
                "--tasks",
                write(d / "tasks-short.yaml", "tasks:\n  - name: days\n    members: [Mon, Tue]\n"),
            ],
            "tasks-short.yaml:3",
        ),
        "weights-tasks-same-name": (
            [
                "weights",
                TOY,
                "--tasks",
                write(d / "days-a.yaml", TASKS_NAMED.format(members="[Mon, Tue, Wed]")),
                "--tasks",
                write(d / "days-b.yaml", TASKS_NAMED.format(members="[Jan, Feb, Mar]")),
            ],
            "days-a.yaml and " + str(d / "days-b.yaml") + " both name their task set 'days'",
        ),
        "weights-tasks-same-file": (
            ["weights", TOY, "--tasks", d / "days-a.yaml", "--tasks", d / "days-a.yaml"],
            "days-a.yaml is given twice",
        ),
        "weights-task-name-repeated": (
            [
                "weights",
                TOY,
                "--tasks",
                write(
                    d / "tasks-twice.yaml",
                    "tasks:\n  - name: d\n    members: [a, b, c]\n  - name: d\n    members: [x, y, z]\n",
                ),
            ],
            "tasks-twice.yaml:4: duplicate task name 'd' (first at",
        ),
    }


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    return case_files(tmp_path_factory.mktemp("bad"))


CASE_IDS = [
    "text-missing",
    "text-empty",
    "text-binary",
    "yaml-malformed",
    "yaml-truncated",
    "jsonl-malformed",
    "jsonl-truncated",
    "text-latin1",
    "conllu-columns",
    "conllu-truncated",
    "conllu-head-out-of-range",
    "conllu-empty",
    "coref-span-out-of-range",
    "coref-antecedent-out-of-range",
    "csv-missing-columns",
    "csv-truncated",
    "csv-empty",
    "csv-latin1",
    "csv-missing",
    "text-nothing",
    "text-tokenizes-to-nothing",
    "text-set-item-tokenizes-to-nothing",
    "text-beyond-context",
    "sequence-beyond-context",
    "layer-out-of-range",
    "head-out-of-range",
    "head-not-a-number",
    "unknown-detector",
    "unknown-relation",
    "model-not-a-model",
    "model-corrupt-gguf",
    "model-truncated-gguf",
    "model-unknown",
    "output-unwritable",
    "output-directory",
    "output-missing-folder",
    "output-exists",
    "png-exists",
    "output-parent-is-a-file",
    "output-name-too-long",
    "csv-name-too-long",
    "png-name-too-long",
    "folder-name-too-long",
    "needle-answer-not-in-needle",
    "ioi-name-missing",
    "ioi-s-not-repeated",
    "context-beyond-model",
    "depths-outside-0-1",
    "context-repeated",
    "depths-repeated",
    "context-empty",
    "needle-answer-octal",
    "needle-jsonl-line-separator",
    "needle-huge-field",
    "needles-before-the-model",
    "ioi-before-the-model",
    "tasks-before-the-model",
    "treebank-before-the-model",
    "text-before-the-model",
    "depths-before-the-model",
    "retrieval-on-an-encoder",
    "ioi-on-an-encoder",
    "kv-sparsity-before-the-model",
    "kv-sparsity-not-a-number",
    "kv-window-before-the-model",
    "kv-context-beyond-model",
    "kv-plan-on-an-encoder",
    "kv-out-file-before-the-model",
    "report-not-headscopes",
    "report-truncated",
    "report-html-exists",
    "sweep-unknown-analysis",
    "sweep-unnumbered-checkpoint",
    "weights-k-zero",
    "weights-tokens-zero",
    "weights-unknown-embedding",
    "weights-tasks-empty",
    "weights-tasks-malformed",
    "weights-task-too-short",
    "weights-tasks-same-name",
    "weights-tasks-same-file",
    "weights-task-name-repeated",
]


def test_catalogue_is_complete(cases):
    assert sorted(cases) == sorted(CASE_IDS) and len(CASE_IDS) >= 20


@pytest.mark.parametrize("case", CASE_IDS)
def test_bad_input_gives_one_clear_line(case, cases, tmp_path, monkeypatch):
    monkeypatch.setenv("HEADSCOPE_CACHE", str(tmp_path / "cache"))
    args, needle = cases[case]
    result = runner.invoke(app, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == 2, (case, result.exit_code, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert needle in result.stderr.replace("\n", " "), result.stderr
    assert len(result.stderr) < 2000, len(result.stderr)  # one short line, even for a huge value
    if case.endswith("-before-the-model"):
        assert "no-such-model" not in result.stderr  # the data error came first
    if case == "output-exists":
        assert (Path(args[-1])).read_text() == "keep me\n"  # untouched


def test_debug_shows_the_traceback(cases):
    args, _ = cases["csv-truncated"]
    result = runner.invoke(app, [*map(str, args), "--debug"], catch_exceptions=False)
    assert result.exit_code == 2 and "Traceback" in result.stderr


# The child announces the first attention map of the first forward pass on stderr, so the test
# interrupts a run that has demonstrably started (not after a guessed sleep). Only the test's
# child is patched; the CLI runs unchanged.
CTRL_C_CHILD = """
import sys
import time
from headscope import capture
from headscope.cli import main

import dataclasses

real_run = capture.run

def announcing_run(loaded, batches, spec):
    announced = []

    def announcing(callback):
        if callback is None:
            return None

        def inner(*args):
            if not announced:
                announced.append(True)
                sys.stderr.write("READY\\n")
                sys.stderr.flush()
                # Inside the first forward pass: wait there for the SIGINT, so a small run is enough.
                time.sleep(600)
            return callback(*args)

        return inner

    # Row chunks (on_layer) or, where every detector reads pairs, the pairs' weights (on_pairs).
    reads = [
        dataclasses.replace(r, on_layer=announcing(r.on_layer), on_pairs=announcing(r.on_pairs))
        if isinstance(r, capture.Attention)
        else r
        for r in spec.reads
    ]
    return real_run(loaded, batches, dataclasses.replace(spec, reads=reads))

capture.run = announcing_run
sys.argv = ["headscope", *sys.argv[1:]]
main()
"""

# Generous bounds for two busy cores: they only stop a hung run, they never pace a healthy one.
READY_TIMEOUT_S = 600
EXIT_TIMEOUT_S = 600


def test_ctrl_c_exits_130_and_leaves_no_file(tmp_path):
    """SIGINT during the forward passes: exit 130, no CSV, no temporary file."""
    import threading

    target = tmp_path / "out.csv"
    args = ["induction", str(TOY), "--seq-len", "30", "--batch", "4", "--csv", str(target)]
    args += ["-o", str(tmp_path / "out.json"), "--format", "json"]
    proc = subprocess.Popen(
        [sys.executable, "-c", CTRL_C_CHILD, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    assert proc.stderr is not None
    received = bytearray()
    ready = threading.Event()

    def read_stderr() -> None:  # a thread, so that no read can block the test past its deadline
        while chunk := os.read(proc.stderr.fileno(), 4096):
            received.extend(chunk)
            if b"READY\n" in received:
                ready.set()

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not ready.wait(timeout=0.5):
            assert proc.poll() is None, f"exited {proc.returncode} before the forward passes: {received!r}"
            assert time.monotonic() < deadline, f"no forward pass within {READY_TIMEOUT_S} s: {received!r}"
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=EXIT_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=60)
    stderr = received.decode("utf-8", "replace")
    assert "layers" in stderr.split("READY")[0], stderr  # the model was loaded first
    assert proc.returncode == 130, (proc.returncode, stderr)
    assert "interrupted" in stderr and "Traceback" not in stderr
    assert list(tmp_path.iterdir()) == [], list(tmp_path.iterdir())
