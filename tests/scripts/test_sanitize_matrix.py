"""scripts/sanitize_matrix.py without a GPU: --resume keeps exactly the runs whose log lacks the
tool's summary line (those never started first), and --from-logs writes the matrix of a mixed set
of logs (clean, hazards, cut short), each cell with its verdict."""
import importlib.util
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("sanitize_matrix", os.path.join(HERE, "..", "..", "scripts", "sanitize_matrix.py"))
sm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sm)


def write(d, name, cmd, body):
    with open(os.path.join(d, name), "w") as fh:
        fh.write(cmd + "\n" + body)


def main():
    with tempfile.TemporaryDirectory() as d:
        h = "compute-sanitizer --tool racecheck h --no-timing --config m128n128_ws2_st5 --mnk 256,1024,512"
        write(d, "racecheck__m128n128_ws2_st5.log", h, "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n1 passed, 0 failed\n")
        write(d, "memcheck__m128n128_ws2_st5.log", h.replace("racecheck", "memcheck"), "========= ERROR SUMMARY: 0 errors\n1 passed, 0 failed\n")
        write(d, "synccheck__m128n128_ws2_st5.log", h.replace("racecheck", "synccheck"), "still running when stopped\n")
        write(d, "initcheck__swapab_m16n64_ws2_st14.log", h.replace("racecheck", "initcheck"), "========= ERROR SUMMARY: 3 errors\n")
        done = {f: sm.finished_log(os.path.join(d, f)) for f in sorted(os.listdir(d))}
        assert done == {"initcheck__swapab_m16n64_ws2_st14.log": True, "memcheck__m128n128_ws2_st5.log": True,
                        "racecheck__m128n128_ws2_st5.log": True, "synccheck__m128n128_ws2_st5.log": False}, done
        assert not sm.finished_log(os.path.join(d, "missing.log"))
        # --only: semicolons between names, since a family's label holds commas.
        fam = "MLA kernels (rope/cache, head GEMM, weight layout)"
        assert fam in [label for label, _ in sm.TEST_FAMILIES]
        pool = [(fam, "", "memcheck", [], ""), ("m128n128_ws2_st5", "", "memcheck", [], ""), ("other", "", "x", [], "")]
        assert [j[0] for j in sm.select_only(pool, fam + ";m128n128_ws2_st5")] == [fam, "m128n128_ws2_st5"]
        assert sm.select_only(pool, "") == pool
        try:
            sm.select_only(pool, "MLA kernels (rope/cache")  # a label cut at its comma: refused, not empty
            raise AssertionError("a name matching nothing was accepted")
        except SystemExit as e:
            assert "no configuration or family" in str(e), e
        jobs = [(f, os.path.join(d, f)) for f in ("synccheck__m128n128_ws2_st5.log", "racecheck__m128n128_ws2_st5.log",
                                                 "racecheck__never.log", "memcheck__never.log")]
        order = [f for f, _ in sm.resume_jobs(jobs)]
        assert order == ["racecheck__never.log", "memcheck__never.log", "synccheck__m128n128_ws2_st5.log"], order
        sm.write_from_logs(d, ["racecheck", "synccheck", "initcheck", "memcheck"], [])
        md = open(os.path.join(d, "matrix.md")).read()
        row = next(l for l in md.splitlines() if l.startswith("| `m128n128_ws2_st5`"))
        assert "stopped by its time limit" in row and row.count("clean") == 2, row
        row = next(l for l in md.splitlines() if l.startswith("| `swapab_m16n64_ws2_st14`"))
        assert "clean" not in row.split("|")[5] and "3" in row, row
    # Past --print-limit the tool prints a second summary line: part of the first count, not more.
    out = ("========= ERROR SUMMARY: 599169 errors\n"
           "========= ERROR SUMMARY: 598969 errors were not printed. Use --print-limit option to adjust\n"
           "[  PASSED  ] 5 tests.\n")
    assert sm.verdict("initcheck", out, 0) == (False, "599169 errors; [  PASSED  ] 5 test"), sm.verdict("initcheck", out, 0)
    assert sm.verdict("memcheck", "========= ERROR SUMMARY: 1 error\n", 9) == (False, "1 errors; rc 9")
    print("sanitize_matrix: resume, from-logs and summary counts ok")


if __name__ == "__main__":
    sys.exit(main())
