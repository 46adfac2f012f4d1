#!/usr/bin/env python3
"""Tests of the course's scripts, each class one CTest test (tests/CMakeLists.txt names it and
gives its folders in the environment: GPU_LESSONS_ROOT, the source tree; GPU_LESSONS_BUILD, the
build; and what a class needs besides). A class that cannot run here skips (unittest's "OK
(skipped=N)", which CTest counts as skipped), saying what is missing.

  Lesson20Trace   lesson 20's --trace writes two Chrome traces that scripts/plot-trace draws
  PlotBenchmarks  scripts/plot-benchmarks draws the recorded JSON, and names a file cut short
  RunBenchmarks   scripts/run-benchmarks --budget and --programs
  GpuPass         scripts/gpu-pass rehearsed on the CPU, as a GPU server runs it
  LabsGraded      every lab's starter fails scripts/grade-lab, a lesson passes it
  MakePages       scripts/make-pages: a page whose quoted transcript changed fails --check
                  until --reread records it as read
  LessonTables    the README's and the main page's tables of lessons list the registry's
                  lessons (lessons/CMakeLists.txt), in order, each with its program and page
  FlavourChoice   scripts/flavour.sh: auto on a machine with an NVIDIA GPU and no PyTorch is the
                  CUDA flavour, and a missing or mismatched CUDA toolkit is named before anything
                  is downloaded
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import unittest

ROOT = os.environ.get("GPU_LESSONS_ROOT", "")
BUILD = os.environ.get("GPU_LESSONS_BUILD", "")
SCRIPTS = os.path.join(ROOT, "scripts")
SYSTEM_PYTHON = "/usr/bin/python3"  # the plots' Python (matplotlib from Debian's packages)


def run(args, env=None, cwd=None):
    """Runs `args` to its end: (exit code, standard output and error as one text)."""
    done = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=None if env is None else {**os.environ, **env}, cwd=cwd)
    return done.returncode, done.stdout


def has_matplotlib():
    return run([SYSTEM_PYTHON, "-c", "import matplotlib"])[0] == 0


class Scratch(unittest.TestCase):
    """A fresh folder for each test, removed afterwards."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gpu-lessons-scripts-")
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

    def path(self, *parts):
        return os.path.join(self.tmp, *parts)


class LessonTables(unittest.TestCase):
    """The tables of lessons written by hand, in the README (program and page of each) and on the
    main page (the page of each, core lessons then going further), name the lessons the build's
    registry has (gpu_lessons_add_lesson in lessons/CMakeLists.txt), each once, in order, and
    every page they link exists: a lesson added, split or renumbered fails here until both
    tables say so."""

    def setUp(self):
        with open(os.path.join(ROOT, "lessons", "CMakeLists.txt")) as f:
            self.lessons = re.findall(r"(?m)^gpu_lessons_add_lesson\(([0-9]{2}_[a-z0-9_]+)", f.read())
        self.assertTrue(self.lessons, "no gpu_lessons_add_lesson call in lessons/CMakeLists.txt")

    def rows(self, path):
        """Each table row of PATH whose first cell is a lesson's number: (number, the row)."""
        with open(os.path.join(ROOT, path)) as f:
            return re.findall(r"(?m)^\| ([0-9]{2}) \|(.*)\|$", f.read())

    def test_readme(self):
        rows = self.rows("README.md")
        self.assertEqual([n for n, _ in rows], [lesson[:2] for lesson in self.lessons])
        for (number, row), lesson in zip(rows, self.lessons):
            self.assertIn(f"`lesson{lesson}`", row, f"README, lesson {number}: its program")
            self.assertIn(f"`docs/lessons/{lesson}.md`", row, f"README, lesson {number}: its page")
            self.assertTrue(os.path.isfile(os.path.join(ROOT, "docs", "lessons", lesson + ".md")))

    def test_main_page(self):
        rows = self.rows(os.path.join("docs", "mainpage.md"))
        self.assertEqual([n for n, _ in rows], [lesson[:2] for lesson in self.lessons])
        for (number, row), lesson in zip(rows, self.lessons):
            self.assertIn(f"](lessons/{lesson}.md)", row, f"main page, lesson {number}: its page")


class MakePages(Scratch):
    """scripts/make-pages, copied into a tree of one page that quotes a transcript: the page is
    written with the transcript's figure; --check fails until --reread records the page as read
    against it; a new capture of the same output (another "# captured:" date) changes nothing;
    a changed figure is written onto the page, and --check fails again, naming the page and the
    transcript, until the page is reread. --reread refuses what is not a source page."""

    def make_pages(self, *args):
        return run([self.path("scripts", "make-pages"), *args], cwd=self.tmp)

    def capture(self, date, figure):
        with open(self.path("docs", "transcripts", "cpu", "x.txt"), "w") as f:
            f.write(f"# captured: {date}\nthe loop took {figure} ms\n")

    def test_a_changed_transcript_fails_until_reread(self):
        os.makedirs(self.path("scripts"))
        shutil.copy(os.path.join(SCRIPTS, "make-pages"), self.path("scripts", "make-pages"))
        os.makedirs(self.path("docs", "src", "lessons"))
        os.makedirs(self.path("docs", "transcripts", "cpu"))
        page = os.path.join("docs", "src", "lessons", "00_page.md")
        with open(self.path(page), "w") as f:
            f.write("# Page {#page}\n\nIt took \\figure{docs/transcripts/cpu/x.txt:took (\\S+ ms)}.\n")
        self.capture("2026-01-01", "5.0")
        code, out = self.make_pages()
        self.assertEqual(code, 0, out)  # written, with a warning: never read
        self.assertIn("quotes what changed since the page was read", out)
        with open(self.path("docs", "lessons", "00_page.md")) as f:
            self.assertIn("It took 5.0 ms.", f.read())
        code, out = self.make_pages("--check")
        self.assertEqual(code, 1, out)
        code, out = self.make_pages("--reread", page)
        self.assertEqual(code, 0, out)
        self.assertEqual(self.make_pages("--check")[0], 0)
        self.capture("2026-02-02", "5.0")  # the same output, captured again
        self.assertEqual(self.make_pages("--check")[0], 0)
        self.capture("2026-03-03", "7.0")  # new output
        code, out = self.make_pages()
        self.assertEqual(code, 0, out)
        with open(self.path("docs", "lessons", "00_page.md")) as f:
            self.assertIn("It took 7.0 ms.", f.read())
        code, out = self.make_pages("--check")
        self.assertEqual(code, 1, out)
        self.assertIn(f"{page} quotes what changed since the page was read: "
                      "docs/transcripts/cpu/x.txt", out)
        self.assertIn("HINT", out)
        self.assertEqual(self.make_pages("--reread", page)[0], 0)
        self.assertEqual(self.make_pages("--check")[0], 0)
        code, out = self.make_pages("--reread", "docs/transcripts/cpu/x.txt")
        self.assertNotEqual(code, 0, out)
        self.assertIn("not a source page", out)


    def test_seconds_shown_in_milliseconds(self):
        os.makedirs(self.path("scripts"))
        shutil.copy(os.path.join(SCRIPTS, "make-pages"), self.path("scripts", "make-pages"))
        os.makedirs(self.path("docs", "src"))
        os.makedirs(self.path("docs", "transcripts", "cpu"))
        with open(self.path("docs", "transcripts", "cpu", "x.txt"), "w") as f:
            f.write("slow 1.095 s/epoch\nfast 0.0100 s/epoch\nnone n/a s/epoch\n")
        with open(self.path("docs", "src", "page.md"), "w") as f:
            f.write("# Page {#page}\n\n| \\figure[ms]{docs/transcripts/cpu/x.txt:slow (\\S+) s} | "
                    "\\figure[ms]{docs/transcripts/cpu/x.txt:fast (\\S+) s} |\n")
        code, out = self.make_pages()
        self.assertEqual(code, 0, out)
        with open(self.path("docs", "page.md")) as f:
            self.assertIn("| 1095 | 10.0 |", f.read())
        with open(self.path("docs", "src", "page.md"), "a") as f:
            f.write("\\figure[ms]{docs/transcripts/cpu/x.txt:none (\\S+) s}\n")
        code, out = self.make_pages()
        self.assertNotEqual(code, 0, out)
        self.assertIn("'n/a' in docs/transcripts/cpu/x.txt is not a number of seconds", out)
        self.assertNotIn("Traceback", out)


    def test_a_ref_cut_at_a_line_end_is_refused(self):
        os.makedirs(self.path("scripts"))
        shutil.copy(os.path.join(SCRIPTS, "make-pages"), self.path("scripts", "make-pages"))
        os.makedirs(self.path("docs", "src"))
        with open(self.path("docs", "src", "page.md"), "w") as f:
            f.write("# Page {#page}\n\nSee `\\ref` and \\ref page \"this page\".\n")
        code, out = self.make_pages()
        self.assertEqual(code, 0, out)
        with open(self.path("docs", "src", "page.md"), "a") as f:
            f.write("As \\ref\npage says.\n")
        code, out = self.make_pages()
        self.assertNotEqual(code, 0, out)
        self.assertIn("docs/src/page.md:4: a \\ref this script cannot read", out)


class Lesson20Trace(Scratch):
    """Lesson 20's --trace FILE writes two Chrome traces that parse as JSON, each with complete
    events ("ph": "X") for every profiled step's ranges, which scripts/plot-trace draws as one
    timeline picture; an unwritable --trace exits 2 with a HINT."""

    LESSON = os.path.join(BUILD, "bin", "lesson20_profiling")
    STEPS = 3  # lesson 20's kQuickSteps

    def test_traces_hold_every_steps_ranges(self):
        code, out = run([self.LESSON, "--quick", "--device", "cpu", "--trace", self.path("t.json")])
        self.assertEqual(code, 0, out)
        for loop in ("lesson05", "lesson12"):
            with open(self.path(f"t-{loop}.json")) as f:
                events = json.load(f)["traceEvents"]
            ranges = [e for e in events if e.get("ph") == "X" and
                      e.get("name") in ("forward", "backward", "optimizer.step")]
            self.assertEqual(len(ranges), 3 * self.STEPS, f"{loop}: the three parts' ranges")
        if not has_matplotlib():
            self.skipTest("no matplotlib in /usr/bin/python3: the picture is not drawn "
                          "(apt-get install python3-matplotlib)")
        picture = self.path("timeline.png")
        code, out = run([os.path.join(SCRIPTS, "plot-trace"), picture, self.path("t-lesson05.json"),
                         self.path("t-lesson12.json"), "--titles", "lesson 05's loop",
                         "lesson 12's loop"])
        self.assertEqual(code, 0, out)
        with open(picture, "rb") as f:
            self.assertEqual(f.read(4), b"\x89PNG")

    def test_an_unwritable_trace_exits_2_with_a_hint(self):
        code, out = run([self.LESSON, "--quick", "--device", "cpu", "--trace",
                         self.path("no-such-folder", "t.json")])
        self.assertEqual(code, 2, out)
        self.assertRegex(out, r"(?m)^HINT:")


class PlotBenchmarks(Scratch):
    """scripts/plot-benchmarks draws the recorded CPU benchmark JSON (docs/benchmarks/cpu) as its
    charts; a JSON file cut short (a run stopped while writing it) is named, its charts are left
    out, the others are still drawn, and the exit is 1 with a HINT."""

    def setUp(self):
        super().setUp()
        if not has_matplotlib():
            self.skipTest("no matplotlib in /usr/bin/python3 (apt-get install python3-matplotlib)")

    def draw(self, folder):
        return run([SYSTEM_PYTHON, os.path.join(SCRIPTS, "plot-benchmarks"), "--all", folder])

    def test_recorded_and_cut_short(self):
        recorded = glob.glob(os.path.join(ROOT, "docs", "benchmarks", "cpu", "*.json"))
        self.assertTrue(recorded, "no recorded JSON in docs/benchmarks/cpu")
        for case in ("all", "cut"):
            os.makedirs(self.path(case, "cpu"))
            for f in recorded:
                shutil.copy(f, self.path(case, "cpu"))
        code, out = self.draw(self.path("all"))
        self.assertEqual(code, 0, out)
        drawn = len(glob.glob(self.path("all", "plots", "*.svg")))
        self.assertGreaterEqual(drawn, 3, out)
        with open(os.path.join(ROOT, "docs", "benchmarks", "cpu", "bench_training.json")) as f:
            head = f.read(2000)
        with open(self.path("cut", "cpu", "bench_training.json"), "w") as f:
            f.write(head)
        code, out = self.draw(self.path("cut"))
        self.assertEqual(code, 1, out)
        self.assertRegex(out, r"cannot read .*bench_training\.json")
        self.assertIn("HINT", out)
        self.assertNotIn("Traceback", out)
        self.assertFalse(os.path.exists(self.path("cut", "plots", "training.svg")), out)
        self.assertEqual(len(glob.glob(self.path("cut", "plots", "*.svg"))), drawn - 1, out)


class ScalingTable(Scratch):
    """scripts/scaling-table: the recorded table is what the recorded GPU run makes (--check); each
    row's speed-ups are the CPU's median over the GPU's, and the first batch where the GPU
    overtakes the CPU is the first whose GPU step is faster; graphed rows and a thread sweep are
    read when the run has them; a CPU-only run or a cut file is an error with a HINT."""

    RECORDED = os.path.join(ROOT, "docs", "benchmarks", "gpu")

    def table(self, *args):
        return run([sys.executable, os.path.join(SCRIPTS, "scaling-table"), *args])

    def medians(self, path):
        with open(path) as f:
            rows = json.load(f)["benchmarks"]
        return {r["run_name"]: r["real_time"] for r in rows if r.get("aggregate_name") == "median"}

    def test_the_recorded_table_is_the_recorded_runs(self):
        code, out = self.table("--check", self.RECORDED)
        self.assertEqual(code, 0, out)

    def test_ratios_and_crossovers(self):
        medians = self.medians(os.path.join(self.RECORDED, "bench_scaling.json"))
        shutil.copy(os.path.join(self.RECORDED, "bench_scaling.json"), self.tmp)
        code, out = self.table(self.tmp)
        self.assertEqual(code, 0, out)
        with open(self.path("scaling-ratios.txt")) as f:
            text = f.read()
        checked = 0
        for line in text.splitlines():
            cells = line.split()
            if len(cells) != 8 or cells[0] not in ("fp32", "bf16"):
                continue
            name = f"precision:{0 if cells[0] == 'fp32' else 2}/width:{cells[1]}/batch:{cells[2]}"
            cpu = medians.get(f"BM_ScalingStepCpu/{name}/manual_time")
            gpu = medians.get(f"BM_ScalingStepCuda/{name}/manual_time")
            self.assertEqual(cells[6], f"{cpu / gpu:.1f}x" if cpu and gpu else "-", line)
            checked += 1
        both = [n for n in medians if n.startswith("BM_ScalingStepCuda/precision:")
                and not n.startswith("BM_ScalingStepCuda/precision:1/")]
        self.assertEqual(checked, len(both), text)  # a row for every fp32 and bf16 GPU case
        batches = [64, 256, 1024, 4096]
        over = [b for b in batches if medians[f"BM_ScalingStepCuda/precision:0/width:128/batch:{b}"
                                              f"/manual_time"]
                < medians[f"BM_ScalingStepCpu/precision:0/width:128/batch:{b}/manual_time"]]
        self.assertIn(f"fp32 width 128: eager: batch {over[0]};", text)

    def test_graphed_rows_and_a_thread_sweep(self):
        with open(os.path.join(self.RECORDED, "bench_scaling.json")) as f:
            run_ = json.load(f)
        more = []
        for row in run_["benchmarks"]:
            if row["run_name"].startswith("BM_ScalingStepCuda/"):  # a graph at half the time
                more.append({**row, "run_name": row["run_name"].replace("Cuda", "GraphedCuda"),
                             "name": row["name"].replace("Cuda", "GraphedCuda"),
                             "real_time": row["real_time"] / 2, "FLOP/s": row["FLOP/s"] * 2})
        for threads, ms in ((1, 40.0), (4, 12.0), (8, 9.0), (16, 10.0)):
            name = (f"BM_ScalingStepThreadsCpu/precision:0/width:1024/batch:1024/"
                    f"threads:{threads}/manual_time")
            more.append({"name": name + "_median", "run_name": name, "run_type": "aggregate",
                         "aggregate_name": "median", "real_time": ms, "time_unit": "ms"})
        run_["benchmarks"] += more
        with open(self.path("bench_scaling.json"), "w") as f:
            json.dump(run_, f)
        code, out = self.table(self.tmp)
        self.assertEqual(code, 0, out)
        with open(self.path("scaling-ratios.txt")) as f:
            text = f.read()
        medians = self.medians(os.path.join(self.RECORDED, "bench_scaling.json"))
        cpu = medians["BM_ScalingStepCpu/precision:0/width:4096/batch:4096/manual_time"]
        gpu = medians["BM_ScalingStepCuda/precision:0/width:4096/batch:4096/manual_time"]
        self.assertRegex(text, rf"fp32 +4096 +4096 .* {cpu / gpu:.1f}x +{2 * cpu / gpu:.1f}x\n")
        bf16 = [tuple(int(p.split(":")[1]) for p in n.split("/")[2:4]) for n in medians
                if n.startswith("BM_ScalingStepCuda/precision:2/")]
        width, batch = max(bf16, key=lambda wb: (wb[0] * wb[1], wb[0]))
        self.assertRegex(text, rf"largest bf16 step \(width {width}, batch {batch}\), graphed: "
                               r".* % of")
        self.assertIn("1: 40.0 ms, 4: 12.0 ms, 8: 9.0 ms, 16: 10.0 ms; fastest with 8", text)

    def test_a_cpu_run_and_a_cut_file_are_refused(self):
        shutil.copy(os.path.join(ROOT, "docs", "benchmarks", "cpu", "bench_scaling.json"), self.tmp)
        code, out = self.table(self.tmp)
        self.assertEqual(code, 1, out)
        self.assertIn("holds no GPU step", out)
        with open(os.path.join(self.RECORDED, "bench_scaling.json")) as f:
            head = f.read(3000)
        with open(self.path("bench_scaling.json"), "w") as f:
            f.write(head)
        code, out = self.table(self.tmp)
        self.assertEqual(code, 1, out)
        self.assertIn("HINT", out)
        self.assertNotIn("Traceback", out)
        self.assertFalse(os.path.exists(self.path("scaling-ratios.txt")))


class RunBenchmarks(Scratch):
    """scripts/run-benchmarks --budget runs every program's cases once, then again with
    repetitions while time is left, and each JSON says how many repetitions it holds; --programs
    runs the programs named alone; a budget too small for any program names them all and exits 1."""

    FILTER = "--benchmark_filter=PeakMatmulCpu/precision:0/"

    def bench(self, *args):
        return run([os.path.join(SCRIPTS, "run-benchmarks"), *args], env={"BUILD_DIR": BUILD})

    def test_budget_and_programs(self):
        code, out = self.bench(self.path("ok"), "--budget", "120", "--programs", "bench_scaling",
                               "--", self.FILTER)
        self.assertEqual(code, 0, out)
        with open(self.path("ok", "bench_scaling.json")) as f:
            recorded = json.load(f)
        names = [b["name"] for b in recorded["benchmarks"]]
        self.assertIn("BM_PeakMatmulCpu/precision:0/n:2048/manual_time_median", names, out)
        self.assertEqual(recorded["context"]["repetitions_asked"], "3")
        self.assertEqual(os.listdir(self.path("ok")).count("bench_scaling.json"), 1)
        self.assertEqual(glob.glob(self.path("ok", "*.part")), [], "part files left")
        self.assertEqual(len(glob.glob(self.path("ok", "*.json"))), 1, "other programs ran")
        for bad in ("bench_nothing", "lesson01_device_check", ""):
            code, out = self.bench(self.path("no"), "--programs", bad)
            self.assertEqual(code, 2, out)
            self.assertIn("HINT", out)
        code, out = self.bench(self.path("none"), "--budget", "1", "--", self.FILTER)
        self.assertEqual(code, 1, out)
        self.assertIn("bench_scaling (no time left)", out)


class GpuPass(Scratch):
    """scripts/gpu-pass rehearsed on the CPU (--device cpu --quick) with GPU_LESSONS_PYTHON (the
    Python whose torch the build links), as a GPU server runs it: its configure stage in a fresh
    folder, with LibTorch found only through the prefix path the pass hands CMake and that Python
    not on the PATH; its run stage with this build, its summary and tarball checked; --only; and
    what it refuses, with a HINT and exit 2. (The build stage, which rebuilds this build and runs
    its tests, is left out: it would rewrite the build the suite running this test uses.)"""

    PYTHON = os.environ.get("GPU_LESSONS_PYTHON", "")

    def setUp(self):
        super().setUp()
        if not self.PYTHON:
            self.skipTest(f"{BUILD} has no Python whose torch is its LibTorch (configure said so)")
        # The PATH without that Python's virtual environment: a server's venv is not active either.
        venv = os.path.dirname(self.PYTHON)
        path = os.environ["PATH"].split(":")
        if os.path.exists(os.path.join(venv, "activate")):
            path = [p for p in path if p != venv]
        self.env = {"GPU_PASS_PYTHON": self.PYTHON, "PATH": ":".join(path)}

    def gpu_pass(self, *args, env=None):
        return run([os.path.join(SCRIPTS, "gpu-pass"), *args], env={**self.env, **(env or {})})

    def summary(self, folder):
        with open(os.path.join(folder, "summary.txt")) as f:
            return f.read()

    def test_configure_in_a_fresh_folder(self):
        code, out = self.gpu_pass(self.path("fresh"), "--stage", "configure", "--device", "cpu",
                                  "--build-dir", self.path("fresh-build"))
        self.assertEqual(code, 0, out)
        with open(self.path("fresh-build", "CMakeCache.txt")) as f:
            found = re.search(r"(?m)^GPU_LESSONS_PYTHON_TORCH:INTERNAL=(.*)$", f.read())
        self.assertEqual(found and found.group(1), self.PYTHON)

    def test_run_stage(self):
        code, out = self.gpu_pass(self.path("pass"), "--stage", "run", "--device", "cpu", "--quick",
                                  "--build-dir", BUILD, "--deadline", "1500")
        summary = self.summary(self.path("pass"))
        self.assertEqual(code, 0, out + summary)
        self.assertNotRegex(summary, r"(?m)^FAIL")
        lessons = sorted("lesson" + os.path.basename(d) for d in glob.glob(
            os.path.join(ROOT, "lessons", "[0-9][0-9]_*")))
        for step in ["transcripts", "yardstick", "plots"] + lessons:
            self.assertRegex(summary, rf"(?m)^(PASS|WAIVED) +{step} ")
        with tarfile.open(self.path("pass", "gpu-pass.tar.gz")) as tar:
            tar.extractall(self.path("x"))
        packed = self.path("x", "gpu-pass")
        gpu = os.path.join(packed, "docs", "transcripts", "gpu")

        def text(name):
            with open(os.path.join(gpu, name)) as f:
                return f.read()
        for lesson in lessons:
            if lesson == "lesson24_two_hosts":  # left out of a GPU pass (its ranks use the CPU)
                self.assertRegex(summary, rf"(?m)^WAIVED +{lesson} ")
                self.assertFalse(os.path.exists(os.path.join(gpu, lesson + ".txt")), lesson)
                continue
            self.assertRegex(text(lesson + ".txt"), r"(?m)^RESULT: ", lesson)
        for extra in ("lesson09_data_parallel.2ranks", "lesson18_silent_failures.2ranks",
                      "lesson10_checkpointing.resume", "lesson10_checkpointing.roundtrip",
                      "lesson14_exact_resume.resume"):
            self.assertTrue(text(extra + ".txt"), extra)
        for lesson in ("09", "18"):  # torchrun's job of one rank
            name = [n for n in lessons if n.startswith(f"lesson{lesson}_")][0]
            self.assertIn(f"RESULT: PASS lesson {lesson} rank 0 of 1", text(name + ".torchrun.txt"))
        for loop in ("lesson05", "lesson12"):  # lesson 20's traces, which --import draws
            self.assertIn('"traceEvents"', text(f"lesson20_profiling-{loop}.json"))
        for bench in glob.glob(os.path.join(BUILD, "bin", "bench_*")):
            with open(os.path.join(packed, "docs", "benchmarks", "gpu",
                                   os.path.basename(bench) + ".json")) as f:
                self.assertIn("benchmarks", json.load(f))
        # The plots, unless the pass waived them (no matplotlib where it ran: --import draws them).
        if not re.search(r"(?m)^WAIVED +plots ", summary):
            self.assertTrue(glob.glob(os.path.join(packed, "docs", "benchmarks", "plots",
                                                   "*-gpu.svg")))
        self.assertTrue(os.path.getsize(os.path.join(packed, "summary.txt")))
        self.assertTrue(os.path.isdir(os.path.join(packed, "logs")))

    def test_only_runs_its_items_in_order(self):
        # Limits far above what the items take alone (about 2 s and 5 s): on a busy machine a
        # benchmark's every case once took over the 10 s a 20 s item leaves it.
        code, out = self.gpu_pass(self.path("only"), "--stage", "run", "--device", "cpu", "--quick",
                                  "--build-dir", BUILD, "--only", "bench_memory:90 lesson01:120")
        self.assertEqual(code, 0, out)
        ran = re.findall(r"(?m)^PASS +(\S+) ", self.summary(self.path("only")))
        self.assertEqual(ran, ["bench_memory", "lesson01", "lesson01_device_check"], out)

    def test_refusals(self):
        # Refused before anything runs: an unknown item or lesson, seconds that are not a number
        # or under 15, --only outside the run stages.
        for stage, only in (("run", "lesson01:60 banana"), ("run", "lesson01:60 lesson99"),
                            ("run", "lesson01:abc"), ("run", "lesson01:0"), ("all", "lesson01")):
            code, out = self.gpu_pass(self.path("bad"), "--device", "cpu", "--build-dir", BUILD,
                                      "--stage", stage, "--only", only)
            self.assertEqual(code, 2, out)
            self.assertIn("HINT", out)
            self.assertNotIn("gpu-pass: lesson01 (at most", out)
        if run([os.path.join(BUILD, "bin", "lesson01_device_check"), "--device", "cuda:0"])[0]:
            code, out = self.gpu_pass(self.path("nogpu"), "--device", "cuda", "--build-dir", BUILD)
            self.assertEqual(code, 2, out)
            self.assertIn("no GPU is visible", out)
            self.assertIn("HINT", out)
        cuda = run([SYSTEM_PYTHON, "-c", "import torch, sys; sys.exit(not torch.version.cuda)"])[0]
        if cuda != 0:  # the system Python has no torch, or one without CUDA
            code, out = self.gpu_pass(self.path("nocuda"), "--device", "cpu",
                                      env={"GPU_PASS_PYTHON": SYSTEM_PYTHON})
            self.assertEqual(code, 2, out)
            self.assertIn("HINT", out)


class FlavourChoice(Scratch):
    """The flavour scripts/flavour.sh decides, on a machine made up for the test: a file standing
    in for the GPU driver's device node (GPU_LESSONS_NVIDIA_DEVICE) and a PATH whose python3 has
    PyTorch 2 or none at all (a script that says so). Then require_cuda_toolkit with no nvcc on
    the PATH, and with an nvcc of another CUDA major version: exit 2, naming what to install."""

    def fake_program(self, name, script):
        folder = self.path("bin")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, name), "w") as f:
            f.write("#!/bin/sh\n" + script + "\n")
        os.chmod(os.path.join(folder, name), 0o755)
        return folder

    def decide(self, env, command='echo "$flavour|$build|$flavour_why"'):
        """What flavour.sh sets, sourced as the scripts source it, with `env` and a PATH of the
        fake programs and the system's own (no /usr/local: no CUDA toolkit)."""
        path = self.path("bin") + ":/usr/bin:/bin"
        return run(["bash", "-c", f'root="$1"; source "$root/scripts/flavour.sh"; {command}',
                    "flavour", ROOT], env={"PATH": path, "GPU_LESSONS_TORCH": "", **env})

    def test_a_gpu_without_pytorch_is_the_cuda_flavour(self):
        node = self.path("nvidia0")
        open(node, "w").close()
        self.fake_program("python3", "exit 1")  # no torch
        code, out = self.decide({"GPU_LESSONS_NVIDIA_DEVICE": node})
        self.assertEqual(code, 0, out)
        flavour, build, why = out.strip().split("|")
        self.assertEqual(flavour, "2.11")
        self.assertEqual(build, os.path.join(ROOT, "build-2.11"))
        self.assertIn(node, why)
        self.assertIn("no CUDA", why)

    def test_no_gpu_or_an_installed_pytorch_keeps_auto(self):
        node = self.path("nvidia0")
        self.fake_program("python3", "exit 1")
        code, out = self.decide({"GPU_LESSONS_NVIDIA_DEVICE": node})  # no node: no GPU
        self.assertEqual((code, out.strip()), (0, f"auto|{os.path.join(ROOT, 'build')}|"))
        open(node, "w").close()
        self.fake_program("python3", "exit 0")  # a PyTorch 2 (a GPU server's): auto finds it
        code, out = self.decide({"GPU_LESSONS_NVIDIA_DEVICE": node})
        self.assertEqual((code, out.strip()), (0, f"auto|{os.path.join(ROOT, 'build')}|"))

    def test_an_explicit_flavour_is_kept(self):
        node = self.path("nvidia0")
        open(node, "w").close()
        self.fake_program("python3", "exit 1")
        code, out = self.decide({"GPU_LESSONS_NVIDIA_DEVICE": node, "GPU_LESSONS_TORCH": "debian"})
        self.assertEqual((code, out.strip().split("|")[0]), (0, "debian"))

    def test_a_missing_or_mismatched_toolkit_is_named(self):
        self.fake_program("python3", "exit 1")
        code, out = self.decide({}, "require_cuda_toolkit 13.0; echo passed")
        self.assertEqual(code, 2, out)
        self.assertIn("nvcc is not on the PATH", out)
        self.assertIn("HINT: install NVIDIA's CUDA 13.x toolkit", out)
        self.assertNotIn("passed", out)
        self.fake_program("nvcc", 'echo "Cuda compilation tools, release 12.4, V12.4.131"')
        code, out = self.decide({}, "require_cuda_toolkit 13.0; echo passed")
        self.assertEqual(code, 2, out)
        self.assertIn("is CUDA 12.4", out)
        self.fake_program("nvcc", 'echo "Cuda compilation tools, release 13.2, V13.2.51"')
        code, out = self.decide({}, "require_cuda_toolkit 13.0; echo passed")
        self.assertEqual((code, out.strip()), (0, "passed"))


class LabsGraded(unittest.TestCase):
    """For every lab scripts/make-labs makes, the untouched starter builds and fails its checks
    (scripts/grade-lab --starters, every starter built at once: exit 0, one line per lab);
    lesson 05's own folder passes scripts/grade-lab (exit 0). So the grader can neither pass an
    empty answer nor fail a right one. (The grader runs a lesson's own tests, which each lesson
    passes in the suite this test belongs to: one lesson graded shows the passing path.) And labs
    05 and 11 done but for their moves (the batches, and in 11 the model, stay on the host) fail,
    saying so: on a CPU-only machine, where such a submission still trains. The labs build in
    GPU_LESSONS_LAB_BUILD, with clang where it is installed (the debian flavour's compiler: less
    than half the time g++ takes)."""

    LABS = os.environ.get("GPU_LESSONS_LAB_BUILD", "")

    def setUp(self):
        self.env = {"LAB_BUILD_DIR": self.LABS,
                    "GPU_LESSONS_TORCH": os.environ.get("GPU_LESSONS_TORCH", "auto")}
        if shutil.which("clang++"):
            self.env["CXX"] = "clang++"

    def grader(self, name, *args):
        """scripts/grade-lab ARGS: (exit code, output), the output kept in a log named NAME."""
        code, out = run([os.path.join(SCRIPTS, "grade-lab"), *args], env=self.env)
        with open(f"{self.LABS}.{name}.log", "w") as f:
            f.write(out)
        return code, out

    def grade(self, nn, folder, want, what, *says):
        code, out = self.grader(f"{nn}.{what}", nn, *([folder] if folder else []))
        last = out.strip().splitlines()[-1] if out.strip() else "(nothing printed)"
        print(f"lab {nn}: {what} exit {code} (want {want}): {last}")
        with self.subTest(lab=nn, what=what):
            self.assertEqual(code, want, out)
            for text in says:
                self.assertIn(text, out)

    def moves_nothing(self, nn, file, count, edit, *says):
        """Lesson NN with `edit` (a regex and its replacement, for each line of FILE), which must
        change COUNT lines, fails its grading, and the grader says every one of `says`."""
        lesson = glob.glob(os.path.join(ROOT, "lessons", nn + "_*"))[0]
        copy = f"{self.LABS}.{nn}-moves-nothing"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(lesson, copy)
        with open(os.path.join(lesson, file)) as f:
            lines = f.read().split("\n")
        edited = list(lines)
        for pattern, replacement in edit:
            edited = [re.sub(pattern, replacement, line) for line in edited]
        changed = sum(a != b for a, b in zip(lines, edited))
        with self.subTest(lab=nn, what="the edit"):  # a failed one does not stop the others
            self.assertEqual(changed, count, f"lab {nn}: the edit changed {changed} lines: update it")
        if changed != count:
            return
        with open(os.path.join(copy, file), "w") as f:
            f.write("\n".join(edited))
        self.grade(nn, copy, 1, "moving-nothing", *says)

    def test_starters_fail_and_a_lesson_passes(self):
        # Every starter, built at once (grade-lab --starters): each builds and fails its checks.
        code, out = self.grader("starters", "--starters")
        print(out)
        labs = sorted(os.path.basename(d)[:2] for d in glob.glob(
            os.path.join(self.LABS, "starters", "[0-9][0-9]_*")))
        self.assertTrue(labs, out)
        self.assertEqual(code, 0, out)
        for nn in labs:
            if nn == "24" and os.geteuid() != 0:  # lesson 24's checks need root, and skip
                self.assertRegex(out, rf"(?m)^lab {nn}: the starter builds; .* not graded here")
                continue
            self.assertRegex(out, rf"(?m)^lab {nn}: the starter builds and fails, as it should: ")
        self.grade("05", os.path.join(ROOT, "lessons", "05_training_loop"), 0, "lesson")
        # Lesson 05: the batches' features and labels left on the host, in training and evaluation.
        self.moves_nothing("05", "training_loop.cpp", 4,
                           [(r"^( *)(features|labels) = (features|labels)\.to\(device\);",
                             r"\1(void)device;")],
                           "stayed on the host")
        # Lesson 11: the model (its trainer) and the batch copies (two lines) left on the host.
        self.moves_nothing("11", "fast_training_loop.cpp", 3,
                           [(r"^( *)trainer\.model->to\(device\);.*", r"\1(void)device;"),
                            (r"host\.(images|labels)\.to\(device_, /\*non_blocking=\*/pinned_\)",
                             r"host.\1")],
                           "moved nothing to the device", "stayed on the host")


if __name__ == "__main__":
    unittest.main(verbosity=2)
