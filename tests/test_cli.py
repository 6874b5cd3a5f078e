"""The command line meets a person halfway (issue 40, item 7):

| what a person does | what they get | test |
|---|---|---|
| mistypes a repo id (the hub answers 401/404, or cannot be reached) | the released entries it is close to | test_mistyped_repo_id_gets_suggestions_* |
| names a folder that does not exist | "no such folder", not a Hub error | test_missing_folder_is_said_plainly |
| `zoo list` on an 80-column terminal | every name whole, no line over 80 | test_list_fits_80_columns |
| `zoo list | …` | plain TSV, one header line; `--json` | test_list_piped_is_tsv_and_json |
| `zoo show` | θ, η as they are, not \\u escapes | test_show_prints_unicode |
| `zoo --version` | the version | test_version |
| a sweep; `zoo release build --workers N` | a line per finished run (step, loss); a line per entry started | test_sweep_prints_each_run, test_release_workers_announce_each_entry |
| `zoo COMMAND --help` | every positional argument explained, an example at the end | test_every_command_explains_its_arguments_and_ends_with_an_example |
| `zoo … --json | jq` | JSON alone on stdout (what else the command says goes to stderr) | test_json_output_is_json_alone |
| a script checks `$?` | 0 done, 1 a runtime error (one line), 2 a usage error, 130 interrupted | test_exit_codes |
| a command writes files (build, eval --out, leaderboard, sweep, stream --output, datasets, pull --local-dir) | the paths, on stderr beside --json | test_json_output_is_json_alone, test_commands_that_write_files_say_where |
| `zoo build` after training | each step said as it starts (evaluation, graphs, card); nothing with --quiet | test_json_output_is_json_alone, test_build_phases_are_said_unless_quiet |
| asks for a revision the repo does not have | one line naming its branches and tags (not other repos) | test_a_wrong_revision_names_the_revisions_the_repo_has |
| `zoo pull --include … --local-dir …`, as `hf download` | those files, verified, in that folder; hostile patterns refused first | test_pull_include_and_local_dir |
"""

from __future__ import annotations

import argparse
import http.server
import io
import json
import os
import socket
import threading
from pathlib import Path

import pytest

from zoo import cli
from zoo.cli.registry import WIDE, list_table
from zoo.science.registry import list_entries
from zoo.storage.locate import release_dir
from zoo.version import __version__


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"icl-zoo {__version__}"


def test_list_piped_is_tsv_and_json(capsys):
    assert cli.main(["list"]) == 0  # captured: not a terminal
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "name\tarch\tsource\ttask\tpaper"
    rows = [line.split("\t") for line in lines[1:]]
    assert [r[0] for r in rows] == [e.name for e in list_entries()] and all(len(r) == 5 for r in rows)
    assert cli.main(["list", "lsa", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed and all("lsa" in e["name"] and set(e) == {"name", "arch", "source", "task", "paper"} for e in listed)


@pytest.mark.parametrize("width", [80, 100, 160])
def test_list_fits_80_columns(width):
    from rich.console import Console

    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=True, color_system=None)
    entries = list_entries()
    list_table(entries, console)
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= width
    text = out.getvalue()
    assert all(e.name in text for e in entries)  # every name whole, never cut
    assert "…" not in "".join(line for line in lines if any(e.name in line for e in entries)).split("paper")[0] or width >= WIDE


def test_show_prints_unicode(capsys):
    assert cli.main(["show", "lsa-d10-c10"]) == 0
    out = capsys.readouterr().out
    assert "θ_GD" in out and "\\u03b8" not in out
    assert json.loads(out)["entry"]["name"] == "lsa-d10-c10"


def test_missing_folder_is_said_plainly(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for argv in (["export", str(tmp_path / "nope")], ["eval", "./nope"], ["pull", str(tmp_path / "a" / "b")]):
        assert cli.main(argv) == 1, argv
        err = capsys.readouterr().err
        assert "no such folder" in err and "Hub" not in err and "401" not in err, (argv, err)


class _Unauthorized(http.server.BaseHTTPRequestHandler):
    """What the Hub answers an anonymous reader for a repo that does not exist: 401."""

    def _answer(self):
        body = b'{"error": "Repository not found"}'
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Error-Code", "RepositoryNotFound")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = do_POST = _answer

    def log_message(self, *args):
        pass


@pytest.fixture
def hub_401():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Unauthorized)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_mistyped_repo_id_gets_suggestions_from_a_hub(hub_401, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    for argv in (["pull", "icl-zoo/lsa-d10-c1", "--endpoint", hub_401],
                 ["export", "icl-zoo/gated-rnn-zucchet-ic", "--endpoint", hub_401]):
        assert cli.main(argv) == 1
        err = capsys.readouterr().err
        assert "no such repo" in err and "401" not in err.replace(hub_401, "<hub>"), err  # the port may hold "401"
        assert ("icl-zoo/lsa-d10-c10" if "lsa" in argv[1] else "icl-zoo/gated-rnn-zucchet-icl") in err.split("did you mean")[1]


def test_mistyped_repo_id_gets_suggestions_offline(capsys, tmp_path, monkeypatch):
    import socket

    with socket.socket() as s:  # a port nobody listens on: the hub cannot be reached
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert cli.main(["pull", "icl-zoo/lsa-d10-c1", "--endpoint", f"http://127.0.0.1:{port}"]) == 1
    err = capsys.readouterr().err
    assert "cannot be reached" in err and "icl-zoo/lsa-d10-c10" in err, err


def test_sweep_prints_each_run(tmp_path, capsys, monkeypatch):
    from zoo.running import sweep

    spec = sweep.SweepSpec.model_validate({"name": "t", "entries": ["lsa-d10-c10"], "seeds": [0, 1], "steps": 3})
    seen = []

    def fake_group(runs, out_dir, steps, device, threads=None, compiled=False, track_alignment=False, progress=False,
                   graphs=True):
        seen.append(progress)
        return [{"run": r.name, "entry": r.entry, "seed": r.seed, "status": "built", "steps": 3, "test_loss": 0.5,
                 "gd_loss": 0.25} for r in runs]

    monkeypatch.setattr(sweep, "run_group", fake_group)
    rows = sweep.run_sweep(spec, tmp_path / "sweep")
    err = capsys.readouterr().err
    assert seen and all(seen)  # each run's training shows its step bar with the loss
    for row in rows:
        assert f"{row['run']}: built, 3 steps, test loss 0.5 (GD 0.25)" in err


def test_release_workers_announce_each_entry(tmp_path, capsys, monkeypatch):
    from zoo.publishing import release
    from zoo.publishing.release import build

    monkeypatch.setattr(build, "make_entry", lambda name, work_root, **kw: {"entry": name})  # where it is looked up
    assert release.make_entry_announced("lsa-d10-c10", tmp_path) == {"entry": "lsa-d10-c10"}
    out = capsys.readouterr().out
    assert f"started lsa-d10-c10 (20,000 recipe steps; {socket.gethostname()} pid {os.getpid()}" in out


def _commands(p: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    """(words, parser) of every subcommand under `p`, nested ones (`hub serve`, `release build`) included."""
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*prefix, name), sub
                yield from _commands(sub, (*prefix, name))


COMMANDS = dict(_commands(cli.parser()))


def test_the_walk_finds_the_nested_commands():
    assert {("hub", "serve"), ("release", "build"), ("release", "unpack"), ("eval",), ("stream",)} <= set(COMMANDS)


@pytest.mark.parametrize("words", COMMANDS, ids=" ".join)
def test_every_command_explains_its_arguments_and_ends_with_an_example(words):
    sub = COMMANDS[words]
    unexplained = [a.dest for a in sub._actions if not a.option_strings and not a.help
                   and not isinstance(a, argparse._SubParsersAction)]
    assert not unexplained, f"zoo {' '.join(words)}: positional arguments without help: {unexplained}"
    assert sub.epilog and "Example" in sub.epilog
    last = sub.format_help().rstrip().splitlines()[-1].strip()
    assert "zoo " + " ".join(words) in last, last  # the help's last line is an example of this very command


@pytest.mark.parametrize("argv", [
    ["build", "lsa-gd-zucchet-icl", "--no-graphs", "--json", "--out", "{tmp}/built"],
    ["leaderboard", "zucchet-icl", "--only", "lsa-gd-zucchet-icl", "--quiet", "--json", "--out", "{tmp}/board"],
    ["eval", "lsa-gd-zucchet-icl", "--json"],
    ["eval", "{release}/lsa-gd-zucchet-icl/model.onnx", "--task", "zucchet-icl", "--json", "--out", "{tmp}/r.json"],
    ["list", "gd", "--json"],
    ["show", "lsa-gd-zucchet-icl"],
], ids=["build", "leaderboard", "eval checkpoint", "eval --task", "list", "show"])
def test_json_output_is_json_alone(argv, tmp_path, capsys):
    argv = [a.format(tmp=tmp_path, release=release_dir()) for a in argv]
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    assert json.loads(out), out[:500]  # the whole of stdout is one JSON document
    if "--out" in argv:  # what the command wrote is said, on stderr
        assert str(tmp_path) in err and argv[argv.index("--out") + 1] in err, err
    if argv[0] == "build":
        assert json.loads(out)["test_loss"] == pytest.approx(json.loads(out)["gd_loss"], rel=1e-4)  # θ_GD is one GD step
        said = [line.strip() for line in err.splitlines() if line.startswith("  ")]
        assert [line.split(" (")[0].rstrip("…") for line in said] == [  # after any training: the seconds are said
            "loading the frozen validation and test splits", "constructing the weights",
            "evaluating on the frozen test split", "saving the weights", "writing the card and its figures"], err
    if argv[0] == "leaderboard":
        rows = json.loads(out)["rows"]
        assert {r["name"] for r in rows} >= {"lsa-gd-zucchet-icl", "least squares"} and (tmp_path / "board").is_dir()


def test_exit_codes(capsys, monkeypatch):
    assert cli.main(["show", "no-such-entry"]) == 1  # a runtime error: one line
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.splitlines()) == 1, err
    for argv in (["show"], ["no-such-command"], ["list", "--source", "bought"], ["release"]):  # usage errors: argparse's 2
        with pytest.raises(SystemExit) as exit_:
            cli.main(argv)
        assert exit_.value.code == 2, argv
        assert "usage: zoo" in capsys.readouterr().err

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.registry, "cmd_show", interrupted)
    assert cli.main(["show", "lsa-gd-zucchet-icl"]) == 130
    assert "interrupted" in capsys.readouterr().err


def test_build_phases_are_said_unless_quiet(capsys):
    from zoo.running.builder import phases

    phases(False)("evaluating")
    assert capsys.readouterr() == ("", "")
    phases(True)("evaluating")
    assert capsys.readouterr() == ("", "  evaluating…\n")


def test_commands_that_write_files_say_where(tmp_path, capsys, monkeypatch):
    import numpy as np

    from zoo.running import sweep

    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    spec = tmp_path / "t.toml"
    spec.write_text('name = "t"\nentries = ["lsa-d10-c10"]\nseeds = [0, 1]\nsteps = 3\n')
    monkeypatch.setattr(sweep, "run_group", lambda runs, *a, **k: [
        {"run": r.name, "entry": r.entry, "seed": r.seed, "status": "built", "steps": 3} for r in runs])
    assert cli.main(["sweep", str(spec), "--out", str(tmp_path / "sweep"), "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("|") and f"wrote {tmp_path / 'sweep' / 'results.md'}, {tmp_path / 'sweep' / 'results.json'}" in err
    monkeypatch.chdir(tmp_path)
    assert cli.main(["sweep", str(spec), "--quiet"]) == 0  # the default folder, named
    assert f"in {os.path.join('runs', 't')}" in capsys.readouterr().err and (tmp_path / "runs" / "t" / "results.md").is_file()

    np.save(tmp_path / "tokens.npy", np.zeros((3, 6), np.float32))  # lsa-gd-zucchet-icl's tokens: d_x + d_y = 6
    argv = ["stream", "lsa-gd-zucchet-icl", "--input", "tokens.npy", "--output", "out.npy", "--quiet"]
    assert cli.main(argv) == 0
    assert capsys.readouterr().err == "wrote out.npy\n" and np.load(tmp_path / "out.npy").shape == (1, 3, 3)

    assert cli.main(["datasets", "verify", "zucchet-icl"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) and err == f"frozen splits in {Path(os.environ['ICL_ZOO_CACHE']) / 'datasets'}\n"


@pytest.fixture(scope="module")
def served_release(tmp_path_factory):
    """A hub serving one released entry's repo as the release publishes it (main, tagged with the version)."""
    import shutil

    from zoo.publishing import hub
    from zoo.storage.locate import VERSION

    tmp = tmp_path_factory.mktemp("served-release")
    shutil.copytree(release_dir() / RELEASED, tmp / RELEASED)
    hub.publish_local(tmp / RELEASED, f"icl-zoo/{RELEASED}", root=tmp / "hub")
    hub.tag_local(tmp / "hub", f"icl-zoo/{RELEASED}", VERSION)
    proc, endpoint = hub.start_server(tmp / "hub")
    try:
        yield endpoint
    finally:
        hub.stop_server(proc)


RELEASED = "lsa-gd-zucchet-icl"


def test_a_wrong_revision_names_the_revisions_the_repo_has(served_release, tmp_path, capsys, monkeypatch):
    from huggingface_hub import constants

    import zoo
    from zoo.storage.locate import VERSION, HubError

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    endpoint, repo = served_release, f"icl-zoo/{RELEASED}"
    assert cli.main(["pull", repo, "--revision", "v9", "--endpoint", endpoint]) == 1
    said = f"{repo} on {endpoint} has no revision 'v9'; its branches: main; its tags: {VERSION}"
    assert capsys.readouterr().err == f"error: {said}\n"  # one line; no other repo suggested
    assert cli.main(["eval", repo, "--revision", "mian", "--endpoint", endpoint, "--json"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err == f"error: {said.replace('v9', 'mian')}; did you mean main?\n"
    with pytest.raises(HubError) as e:
        zoo.from_pretrained(repo, revision="v9", endpoint=endpoint)
    assert str(e.value) == said


def test_pull_include_and_local_dir(served_release, tmp_path, capsys, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))  # read per call (HF_HOME: at import)
    endpoint, repo, released = served_release, f"icl-zoo/{RELEASED}", release_dir() / RELEASED
    for bad in ("../config.json", "/etc/passwd", "sub/*.onnx", "a\\b", "*\x00", ""):  # refused before any download
        assert cli.main(["pull", repo, "--endpoint", endpoint, "--include", bad, "--local-dir", str(tmp_path / "g")]) == 1
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and "not a file name pattern" in err, (bad, err)
    assert not (tmp_path / "hf").exists() and not (tmp_path / "g").exists()

    outside = tmp_path / "outside.json"
    outside.write_text("keep me")
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "config.json").symlink_to(outside)  # replaced, never written through
    argv = ["pull", repo, "--endpoint", endpoint, "--include", "*.onnx", "--include", "config.json", "--local-dir",
            str(tmp_path / "g")]
    assert cli.main(argv) == 0
    wanted = ["config.json", "model.onnx", "model_chunk.onnx", "model_step.onnx"]
    out = capsys.readouterr().out
    assert out.startswith(f"{repo}@main → {tmp_path / 'g'}: {', '.join(wanted)}  ({RELEASED}, verified against release")
    assert sorted(p.name for p in (tmp_path / "g").iterdir()) == wanted and outside.read_text() == "keep me"
    assert all((tmp_path / "g" / n).read_bytes() == (released / n).read_bytes() for n in wanted)
    assert not (tmp_path / "hf").exists()  # through a temporary cache: the Hugging Face cache is untouched

    assert cli.main(["pull", repo, "--endpoint", endpoint, "--include", "*.json"]) == 0  # in the cache: said which
    out = capsys.readouterr().out
    assert f"{tmp_path / 'hf'}" in out and out.split(": ", 1)[1].startswith("config.json, eval_results.json  (")
    assert cli.main(["pull", repo, "--endpoint", endpoint, "--include", "*.bin"]) == 1
    assert "none of icl-zoo/lsa-gd-zucchet-icl's files match (its files: README.md, config.json" in capsys.readouterr().err
    assert cli.main(["pull", repo, "--endpoint", endpoint, "--local-dir", str(outside)]) == 1
    assert capsys.readouterr().err == f"error: --local-dir {outside}: not a folder\n"
