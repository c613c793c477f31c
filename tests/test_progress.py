"""What a person sees while a compile trains: a live bar on a terminal, plain lines in a log or a pipe."""

import sys

from edgebert.progress import Progress, clock


def _run(name: str, **kwargs) -> None:
    progress = Progress(10, name, **kwargs)
    progress.show(loss="0.5000")
    for step in range(10):
        progress.update()
        if step == 4:
            progress.show(accuracy="91.00")
            progress.write("step 5: loss 0.5000 accuracy 91.00")
    progress.close()


def test_a_log_gets_plain_lines_with_the_time_left_and_no_bar_frames(capsys):
    _run("distill", every_s=0)
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = err.splitlines()
    assert lines[0].startswith("edgebert: distill: 1/10 (10%), 0:00, about ") and "left, loss 0.5000" in lines[0]
    assert "step 5: loss 0.5000 accuracy 91.00" in lines
    assert lines[-1].startswith("edgebert: distill: 10/10 (100%)") and lines[-1].endswith("accuracy 91.00")
    assert "left" not in lines[-1]


def test_a_log_line_comes_once_a_period_not_once_a_step(capsys):
    _run("distill")  # the default period is a minute: only the closing line
    lines = capsys.readouterr().err.splitlines()
    assert [line for line in lines if line.startswith("edgebert:")] == [lines[-1]]


def test_a_terminal_gets_one_live_bar_with_the_latest_metric(monkeypatch, capsys):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    _run("prune")
    err = capsys.readouterr().err
    assert "\r" in err and "prune" in err and "accuracy=91.00" in err and "loss=0.5000" in err
    assert "edgebert: prune:" not in err  # the bar, not the lines


def test_another_ranks_progress_says_nothing(capsys):
    _run("prune", enabled=False, every_s=0)
    assert capsys.readouterr().err == ""


def test_clock():
    assert (clock(5), clock(65), clock(3725)) == ("0:05", "1:05", "1:02:05")
