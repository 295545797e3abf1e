"""conformance/forked.py: ``python -m MODULE ARGS`` in a fork of a preloaded server must give what a fresh
interpreter gives: the environment, threads and folder asked for, ``sys.argv``, the exit status, and stdout and
stderr apart."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from conformance import cores, forked

pytestmark = pytest.mark.requires("components")  # a tool of the suite itself: checked once, under the reference

CHILD = """\
import sys
print("out", sys.argv)
print("err", file=sys.stderr)
{end}
"""


@pytest.mark.parametrize(
    "end, status, err",
    [
        ("", 0, ""),
        ("sys.exit(3)", 3, ""),
        ("sys.exit('refused: a reason')", 1, "\nrefused: a reason\n"),  # Python's own: the text, status 1
        ("raise KeyError('lost')", 1, "\nKeyError: 'lost'\n"),  # and the traceback
    ],
    ids=["ends", "exits-3", "exits-with-text", "raises"],
)
def test_a_module_runs_as_python_m_with_its_argv_status_and_output_apart(tmp_path, end, status, err):
    (tmp_path / "child_module.py").write_text(CHILD.format(end=end))
    cmd = [sys.executable, "-m", "child_module", "a", "--b"]
    proc = forked.run(cmd, cwd=tmp_path)  # -m finds a module of the working folder
    assert proc.args == cmd and proc.returncode == status, (proc.returncode, proc.stderr)
    assert proc.stdout == f"out {[str(tmp_path / 'child_module.py'), 'a', '--b']}\n"
    assert proc.stderr.startswith("err\n") and err in proc.stderr, proc.stderr


def test_a_forked_childs_collections_leave_the_preloaded_heap_alone(tmp_path):
    """pytest collects garbage twice as a run ends (its unraisable-exception check): over the server's heap of
    torch, transformers and Inductor that was 0.5 s of a fault's 1.5 s run on a 2-core AMD EPYC (2026-12-06).
    What the child inherits is frozen, so a collection scans only what the child made."""
    (tmp_path / "child_module.py").write_text(
        "import gc\n"
        "print(gc.get_freeze_count(), len(gc.get_objects()))\n"
    )
    proc = forked.run([sys.executable, "-m", "child_module"], cwd=tmp_path)
    frozen, tracked = map(int, proc.stdout.split())
    assert frozen > 100_000 and tracked < frozen / 10, (frozen, tracked)  # torch alone is several 100,000 objects


@pytest.mark.parametrize("outcome, status", [("passed", 0), ("failed", 1)])
def test_a_forked_pytest_run_has_the_given_environment_threads_and_folder(tmp_path, outcome, status):
    """The fork must see the environment and thread counts a fresh process would, not the server's."""
    (tmp_path / "test_child.py").write_text(
        "import os, torch\n"
        "from torch._inductor import config\n"
        "def test_child():\n"
        "    assert os.environ['FORKED_RUN_MARK'] == 'here' and 'HOME' not in os.environ\n"
        f"    assert torch.get_num_threads() == 1 and os.getcwd() == {str(forked.ROOT)!r}\n"
        "    assert config.compile_threads == 3\n"  # read by the server at import, from another environment
        f"    assert {outcome == 'passed'}\n"
    )
    # HOME: in the server's environment since it started, absent from the run's
    env = {**{k: v for k, v in os.environ.items() if k != "HOME"}, "FORKED_RUN_MARK": "here", "OMP_NUM_THREADS": "1"}
    env[cores.COMPILE_THREADS] = "3"
    cmd = [sys.executable, "-m", "pytest", str(tmp_path / "test_child.py"), "-q", "-p", "no:cacheprovider",
           "-p", "no:xdist"]  # fmt: skip
    proc = forked.run(cmd, env=env)
    assert proc.returncode == status and f"1 {outcome}" in proc.stdout, proc.stdout + proc.stderr


# a fresh interpreter leaves OMP_NUM_THREADS to OpenMP, which ignores a bad one; pytest's check is conftest.py's
@pytest.mark.parametrize("threads", ["4,2", "", "four"])
def test_a_forked_run_reads_omp_num_threads_as_openmp_does_and_names_a_bad_one(threads, tmp_path):
    """An empty OMP_NUM_THREADS was a ValueError before the run's output was redirected: every fault survived.
    "4,2" is 4, as OpenMP reads it; "" and "four" are refused in the run's own output, where the note reads it."""
    (tmp_path / "test_child.py").write_text("def test_child():\n    pass\n")
    env = {**os.environ, "OMP_NUM_THREADS": threads}
    cmd = [sys.executable, "-m", "pytest", str(tmp_path / "test_child.py"), "-q", "-p", "no:cacheprovider",
           "-p", "no:xdist"]  # fmt: skip
    proc = forked.run(cmd, env=env)
    if threads == "4,2":
        assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout + proc.stderr
    else:
        assert proc.returncode != 0
        assert f"OMP_NUM_THREADS={threads!r}: expected a whole number of threads >= 1" in proc.stderr


@pytest.mark.parametrize("argv", [["python3", "-m", "pytest"], [sys.executable, "script.py"], [sys.executable, "-m"]])
def test_anything_but_python_m_module_is_refused(argv):
    with pytest.raises(ValueError, match=r"argv: expected \[sys.executable, '-m', MODULE, \.\.\.\]"):
        forked.run(argv)


def test_a_child_past_its_timeout_is_killed_and_raises_with_its_output_as_subprocess_does(tmp_path):
    (tmp_path / "sleeper.py").write_text(
        "import os, sys, time\nprint(os.getpid(), flush=True)\nprint('waiting', file=sys.stderr, flush=True)\n"
        "time.sleep(60)\n"
    )
    with pytest.raises(subprocess.TimeoutExpired) as expired:
        forked.run([sys.executable, "-m", "sleeper"], cwd=tmp_path, timeout=3)
    assert expired.value.stderr == "waiting\n"
    with pytest.raises(ProcessLookupError):  # killed, not left running
        os.kill(int(expired.value.output), 0)


def test_where_torch_sees_a_cuda_device_the_child_is_still_a_fork_of_the_server(monkeypatch, tmp_path):
    """Until 2026-12-07 a CUDA machine started a fresh interpreter instead, this process's own child; a fork is
    the server's."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    (tmp_path / "parent.py").write_text(
        "import os, sys\nprint(os.getppid())\nprint(sys.argv[1:], file=sys.stderr)\nsys.exit(int(os.environ['A']))\n"
    )
    proc = forked.run([sys.executable, "-m", "parent", "x"], env={"A": "4"}, cwd=tmp_path, timeout=60)
    assert (proc.returncode, proc.stderr) == (4, "['x']\n") and int(proc.stdout) != os.getpid(), proc.stdout


def test_the_server_turns_on_the_nvml_device_check_before_inductor_asks_for_cuda(tmp_path):
    """On a GPU, Inductor's import asks torch whether CUDA is there; before the NVML check that left every
    child unable to use CUDA (H100, perf/NOTES.md v47). The CPU's view of the GPU rule below: the child inherits
    the server's modules in their import order, and its environment is its caller's, not the server's."""
    (tmp_path / "order_child.py").write_text(
        "import os, sys\nloaded = list(sys.modules)\n"
        "print(loaded.index('conformance.nvml_device_check') < loaded.index('torch._inductor.compile_fx'))\n"
        "print(os.environ.get('PYTORCH_NVML_BASED_CUDA_CHECK'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_NVML_BASED_CUDA_CHECK"}
    proc = forked.run([sys.executable, "-m", "order_child"], env=env, cwd=tmp_path, timeout=60)
    assert (proc.returncode, proc.stdout) == (0, "True\nNone\n"), proc.stderr[-2000:]


@pytest.mark.gpu
def test_on_cuda_a_forked_child_uses_the_device(tmp_path):
    """The server's imports ask torch whether CUDA is there; with torch's default check that marks the server,
    and a child forked from it fails at its first CUDA call ("Cannot re-initialize CUDA in forked subprocess",
    five tests on an H100, perf/NOTES.md v31). conformance/nvml_device_check.py keeps the server unmarked. The
    child, a fork of the server and not this process's own (which has used CUDA), runs a kernel."""
    (tmp_path / "cuda_child.py").write_text(
        "import os, sys, torch\n"
        "print(os.getppid(), 'torch._inductor.compile_fx' in sys.modules, torch.ones(3, device='cuda').sum().item())\n"
    )
    proc = forked.run([sys.executable, "-m", "cuda_child"], cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    parent, preloaded, total = proc.stdout.split()
    # the server's preloaded modules: a fork, not the fresh interpreter a marked server's child becomes
    assert int(parent) != os.getpid() and preloaded == "True" and total == "3.0", proc.stdout


def test_a_child_of_a_server_marked_for_cuda_becomes_a_fresh_interpreter_in_place(monkeypatch):
    """Where NVML cannot count the devices, torch's check marks the server after all (conformance/
    nvml_device_check.py); a child that went on would fail at its first CUDA call."""
    started = []
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: True)
    monkeypatch.setattr(os, "chdir", started.append)
    monkeypatch.setattr(os, "execve", lambda path, argv, env: started.append((path, argv, env)))
    forked._start_afresh_if_cuda_is_unusable("pkg.mod", ["a", "--b"], {"E": "1"}, "/some/folder")
    assert started == ["/some/folder", (sys.executable, [sys.executable, "-m", "pkg.mod", "a", "--b"], {"E": "1"})]
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: False)
    started.clear()
    forked._start_afresh_if_cuda_is_unusable("pkg.mod", [], {}, "/some/folder")
    assert started == []


RANK = """\
import os, sys
import torch
import torch.distributed as dist
names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
print(*(os.environ[name] for name in names))
dist.init_process_group("gloo")  # env://, as under torchrun
total = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(total)
print(int(total.item()))
dist.destroy_process_group()
"""


@pytest.mark.parametrize("size", [1, 3])
def test_ranks_get_torchruns_variables_and_reach_each_other(tmp_path, size):
    (tmp_path / "rank_module.py").write_text(RANK)
    ranks = forked.run_ranks([sys.executable, "-m", "rank_module"], size, cwd=tmp_path, timeout=120)
    assert [proc.returncode for proc in ranks] == [0] * size, [proc.stderr[-2000:] for proc in ranks]
    lines = [proc.stdout.splitlines() for proc in ranks]
    port = lines[0][0].split()[-1]
    assert [line[0] for line in lines] == [f"{r} {r} {size} {size} 127.0.0.1 {port}" for r in range(size)]
    assert [line[1] for line in lines] == [str(size * (size + 1) // 2)] * size  # the all-reduce's sum, on each


def test_a_failing_rank_ends_the_others_as_torchrun_does(tmp_path):
    """Rank 1 would wait for rank 0 forever (as in a collective); rank 0 fails as soon as rank 1 has written
    its process id (renamed into place whole), so the test knows which process must be gone: a rank 0 that
    failed at once could end rank 1 before rank 1 had said which process it was (seen on a loaded CI host)."""
    (tmp_path / "failing.py").write_text(
        "import os, sys, time\n"
        "if os.environ['RANK'] == '0':\n"
        "    deadline = time.monotonic() + 50\n"
        "    while not os.path.exists('rank1.pid') and time.monotonic() < deadline:\n"
        "        time.sleep(0.01)\n"
        "    sys.exit(5)\n"
        "with open('rank1.tmp', 'w') as f:\n"
        "    f.write(str(os.getpid()))\n"
        "os.rename('rank1.tmp', 'rank1.pid')\n"
        "time.sleep(600)\n"
    )
    ranks = forked.run_ranks([sys.executable, "-m", "failing"], 2, cwd=tmp_path, timeout=60)
    assert [proc.returncode for proc in ranks] == [5, -9]
    with pytest.raises(ProcessLookupError):  # killed, not left running
        os.kill(int((tmp_path / "rank1.pid").read_text()), 0)


def test_no_ranks_is_refused():
    with pytest.raises(ValueError, match=r"^size: expected an int >= 1, got 0$"):
        forked.run_ranks([sys.executable, "-m", "x"], 0)
