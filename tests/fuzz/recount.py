#!/usr/bin/env python3
"""Re-runs the ten classes of hostile input of docs/robustness.md with bounded counts and
prints the outcome table (markdown): tried / clear error / accepted correctly / crash / hang /
sanitizer report / silent coercion.

Usage: recount.py BUILD_DIR [--sanitize-dir DIR] [--out FILE]
BUILD_DIR holds tools/fp8proj/fp8proj, tests/fp8proj_safetensors_probe and
tests/fp8proj_cpu_tests (a CPU-only build is enough). With --sanitize-dir (the ASan+UBSan tree
of tests/sanitize/run.sh) its binaries are used instead, so that memory errors and undefined
behaviour show as sanitizer reports.
"""
import argparse
import json
import os
import random
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
COLS = ["tried", "clear error", "accepted correctly", "crash", "hang", "sanitizer report", "silent coercion"]
SAN_MARKERS = ("ERROR: AddressSanitizer", "runtime error:", "ERROR: LeakSanitizer", "UndefinedBehaviorSanitizer")


class Tally:
    def __init__(self):
        self.rows = {}
        self.findings = []

    def add(self, cls, outcome, detail=""):
        if outcome not in ("clear error", "accepted correctly"):
            self.findings.append(f"{cls}: {outcome}: {detail[:300]}")
        r = self.rows.setdefault(cls, dict.fromkeys(COLS, 0))
        r["tried"] += 1
        r[outcome] += 1

    def markdown(self):
        lines = ["| class | " + " | ".join(COLS) + " |", "|---|" + "---:|" * len(COLS)]
        for cls, r in self.rows.items():
            lines.append(f"| {cls} | " + " | ".join(str(r[c]) for c in COLS) + " |")
        return "\n".join(lines)


def run(argv, env=None, timeout=30, stdin=None, cwd=None):
    e = {k: v for k, v in os.environ.items() if not k.startswith("FP8PROJ_")}
    e.update(env or {})
    e.setdefault("ASAN_OPTIONS", "detect_leaks=1:allocator_may_return_null=1")
    try:
        p = subprocess.run(argv, env=e, capture_output=True, text=True, errors="replace", timeout=timeout,
                           input=stdin, cwd=cwd)
    except subprocess.TimeoutExpired:
        return None, ""
    return p.returncode, p.stdout + p.stderr


def classify(rc, out, expect_ok, must_contain=""):
    if rc is None:
        return "hang"
    if any(m in out for m in SAN_MARKERS):
        return "sanitizer report"
    if rc < 0 or rc >= 128:
        return "crash"
    if expect_ok:
        return "accepted correctly" if rc == 0 and must_contain in out else "silent coercion"
    return "clear error" if rc != 0 and must_contain in out else "silent coercion"


def st_file(header: bytes, data: bytes) -> bytes:
    return struct.pack("<Q", len(header)) + header + data


def probe_lines(probe, lines, timeout=120):
    """Runs the probe over many lines; returns one (rc, text) per line (a crash ends the rest)."""
    rc, out = run([probe], stdin="\n".join(lines) + "\n", timeout=timeout)
    answers = out.splitlines()
    res = []
    for i in range(len(lines)):
        if rc is None:
            res.append((None, ""))
        elif i < len(answers) and (answers[i].startswith("ok") or answers[i].startswith("err")):
            res.append((0 if answers[i].startswith("ok") else 1, answers[i] + ("\n" + out if rc != 0 else "")))
        else:
            res.append((rc if rc != 0 else -1, out))
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--sanitize-dir")
    ap.add_argument("--out")
    ap.add_argument("--seed", type=int, default=31)
    a = ap.parse_args()
    b = a.sanitize_dir or a.build
    cli = os.path.abspath(os.path.join(b, "tools/fp8proj/fp8proj"))
    probe = os.path.abspath(os.path.join(b, "tests/fp8proj_safetensors_probe"))
    gtests = os.path.abspath(os.path.join(b, "tests/fp8proj_cpu_tests"))
    rng = random.Random(a.seed)
    t = Tally()
    tmp = tempfile.mkdtemp(prefix="fp8proj_recount_")

    def write(name, data):
        p = os.path.join(tmp, name)
        with open(p, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
        return p

    # 1. deep nesting in shape / data_offsets / __metadata__ / a tensor name's entry.
    lines, expect = [], []
    for i, depth in enumerate([2, 3, 10, 63, 64, 65, 127, 128, 129, 1000, 10000, 65000, 200000] * 4):
        where = ["shape", "data_offsets", "__metadata__", "extra"][i % 4]
        deep = b"[" * depth + b"]" * depth
        if where == "__metadata__":
            h = b'{"__metadata__": {"k": ' + deep + b'}, "t": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}'
        elif where == "extra":
            h = b'{"t": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1], "x": ' + deep + b"}}"
        else:
            h = b'{"t": {"dtype": "U8", "' + where.encode() + b'": ' + deep + b', "shape": [1]}}'
        lines.append(write(f"deep{i}.safetensors", st_file(h, b"x")))
        # Valid only as an unknown extra field (ignored, as the reference ignores it) within the
        # nesting bound: 2 levels of the header around it.
        expect.append(where == "extra" and depth + 2 <= 64)
    for (rc, out), ok in zip(probe_lines(probe, lines), expect):
        t.add("1. deeply nested header", classify(rc, out, ok))

    # 2. tuned table problems -> `fp8proj info`: exit 0, one "using defaults" line.
    good = {"format": "fp8proj-tune/1",
            "stamp": {"gpu_name": "X", "sm_count": 1, "driver": "", "cuda_runtime": "", "cublaslt": "",
                      "fp8proj_version": ""},
            "shapes": [{"n": 128, "k": 128, "threshold": 1, "buckets": [
                {"m_lo": 1, "m_hi": 4, "fp8_backend": "a", "fp8_config": "", "bf16_us": 1, "fp8_us": 1}]}]}
    tables = []
    for key in ["format", "stamp", "shapes"]:
        tables.append(json.dumps({k: v for k, v in good.items() if k != key}))
    for key in good["stamp"]:
        g = json.loads(json.dumps(good))
        del g["stamp"][key]
        tables.append(json.dumps(g))
    text = json.dumps(good)
    for cut in range(1, len(text), max(1, len(text) // 20)):
        tables.append(text[:cut])
    paths = [write(f"table{i}.json", x) for i, x in enumerate(tables)]
    fifo = os.path.join(tmp, "fifo.json")
    os.mkfifo(fifo)
    paths += [tmp, fifo, "/dev/zero", "/dev/null", os.path.join(tmp, "absent.json")]
    for p in paths:
        rc, out = run([cli, "info"], {"FP8PROJ_TUNE_FILE": p})
        outcome = classify(rc, out, True, "using defaults")
        if outcome == "accepted correctly" and out.count("using defaults") != 1:
            outcome = "silent coercion"
        t.add("2. bad tuned table (fallback, one log line)", "clear error" if outcome == "accepted correctly" else outcome)

    # 3. argument checks before work (the row-parallel forward without a communicator).
    rc, out = run([gtests, "--gtest_filter=*TpRecombine*:Hostile.RowParallel*"], timeout=600)
    n = out.count("[       OK ]") + out.count("[  FAILED  ]")
    for _ in range(max(n, 1)):
        t.add("3. argument checks before work (gtests)", classify(rc, out, True, "PASSED"))

    # 4. FIFOs and devices as checkpoint / table / id file (the id file: gtest).
    ck_fifo = os.path.join(tmp, "ck.safetensors")
    os.mkfifo(ck_fifo)
    for (rc, out) in probe_lines(probe, [ck_fifo, "ck " + ck_fifo, "/dev/zero", "ck /dev/zero", "ck /dev/null", tmp],
                                 timeout=20):
        t.add("4. FIFO / device as input", classify(rc, out, False, "err"))
    for p in [fifo, "/dev/zero", "/dev/urandom"]:
        rc, out = run([cli, "tune", "--from", p, "--md", os.path.join(tmp, "x.md")], timeout=20)
        t.add("4. FIFO / device as input", classify(rc, out, False, "not a regular file"))
    rc, out = run([gtests, "--gtest_filter=Hostile.SpecialFiles*"], timeout=60)
    t.add("4. FIFO / device as input", classify(rc, out, True, "PASSED"))

    # 5. launcher and layer variables: out of range / malformed refused with the name.
    bad_ints = ["4294967296", "-1", "99999999999999999999", "1.5", "1e3", "0x10", " 1", "true", "", "+1", "9223372036854775808"]
    for var in ["FP8PROJ_MIN_FP8_TOKENS", "FP8PROJ_DECODE_CEILING"]:
        for v in bad_ints:
            if v == "":
                continue  # empty = unset, by design
            rc, out = run([cli, "explain", "--fp8", "--shape", "256x256", "--m", "1"], {var: v})
            t.add("5. environment values", classify(rc, out, v in ("4294967296",), "" if v == "4294967296" else var))
    rc, out = run([gtests, "--gtest_filter=Hostile.Launcher*:Hostile.OneStrict*:Env.*"], timeout=60)
    t.add("5. environment values", classify(rc, out, True, "PASSED"))

    # 6. CLI integers.
    big = [str(2**31 + 1), str(2**62), str(2**63), str(2**64), "-1", "0", "1.5", "1e3", "nan", "true", "0x10", "-4294967292", "4294967297"]
    opts = [(["explain", "--shape", "256x256", "--m"], 1, 2**31), (["explain", "--tp"], 1, 1024),
            (["tp", "explain", "--cpu", "--tp"], 1, 1024),
            (["bench", "--cpu", "--shape", "128x128", "--m", "1", "--reps"], 1, 10**6),
            (["layer", "--cpu", "--seqlen"], 1, 2**20), (["layer", "--cpu", "--seqs"], 1, 2**20),
            (["tune", "--cpu", "--dry-run", "--max-m"], 1, 2**31), (["tune", "--cpu", "--dry-run", "--first-bucket"], 1, 2**31),
            (["tune", "--cpu", "--dry-run", "--max-split"], 0, 16)]
    for argv, lo, hi in opts:
        for v in big:
            try:
                ok = lo <= int(v) <= hi
            except ValueError:
                ok = False
            if ok:
                continue  # in range: a real run, not a hostile case
            rc, out = run([cli] + argv + [v], timeout=60)
            t.add("6. CLI integers", classify(rc, out, False, argv[-1]), f"{argv} {v}: rc={rc} {out[-200:]}")
    for v in ["1-" + str(2**62), "1-" + str(2**63 - 1), "5-1", "1-", "-5", "1,,2", "a"]:
        rc, out = run([cli, "explain", "--shape", "256x256", "--m", v], timeout=60)
        t.add("6. CLI integers", classify(rc, out, False, "--m"), f"--m {v}: rc={rc} {out[-200:]}")
    for shape in ["144115188075855873x128", "2147483648x2147483648", "0x5", "5x", "x5", "-1x5", "1.5x2"]:
        rc, out = run([cli, "explain", "--shape", shape], timeout=60)
        t.add("6. CLI integers", classify(rc, out, False, "shape"), f"--shape {shape}: rc={rc} {out[-200:]}")
    for argv in (["bench", "--cpu", "--m", "1", "--reps", "1", "--shape", "128x128", "--csv", "/dev/full"],
                 ["tune", "--cpu", "--shape", "128x128", "--max-m", "2", "--reps", "1", "--warmup", "0", "--out", "/dev/full"]):
        rc, out = run([cli] + argv, timeout=120, cwd=tmp)
        t.add("6. CLI integers", classify(rc, out, False, "failed"), f"{argv}: rc={rc} {out[-200:]}")
    with open("/dev/full", "w") as full:
        p = subprocess.run([cli, "info"], stdout=full, stderr=subprocess.PIPE, text=True)
        t.add("6. CLI integers", "clear error" if p.returncode == 1 and "failed" in p.stderr else
              ("crash" if p.returncode < 0 else "silent coercion"))

    # 7. tune --margin / --tolerance.
    for v in ["nan", "-nan", "inf", "-inf", "-100", "-0.5", "101", "1e308", "1e999", "3%", ""]:
        rc, out = run([cli, "tune", "--cpu", "--dry-run", "--margin", v], timeout=60)
        t.add("7. tune --margin", classify(rc, out, False, "--margin"))
    for v in ["0", "3", "99.5"]:
        rc, out = run([cli, "tune", "--cpu", "--dry-run", "--max-m", "4", "--margin", v], timeout=60)
        t.add("7. tune --margin", classify(rc, out, True, "plan:"))

    # 8. tuned-table values (explicit load: `tune --from`).
    weird = [True, False, 12.5, 1e300, 2**64, 2**63, 2**63 - 1, -1, 0, "x", None, [], {}, -2**63, 1e-300]
    fields = [("stamp", "sm_count"), ("shape", "n"), ("shape", "k"), ("shape", "threshold"),
              ("bucket", "m_lo"), ("bucket", "m_hi"), ("bucket", "bf16_us"), ("bucket", "fp8_us")]
    for where, key in fields:
        for v in weird:
            g = json.loads(json.dumps(good))
            obj = g["stamp"] if where == "stamp" else g["shapes"][0] if where == "shape" else g["shapes"][0]["buckets"][0]
            obj[key] = v
            p = write("t8.json", json.dumps(g))
            rc, out = run([cli, "tune", "--from", p, "--md", os.path.join(tmp, "x.md")], timeout=30)
            valid = isinstance(v, (int, float)) and not isinstance(v, bool) and (
                (key == "sm_count" and isinstance(v, int) and 0 <= v <= 2**20) or
                (key in ("n", "k") and isinstance(v, int) and v == 128) or
                (key == "threshold" and isinstance(v, int) and 0 <= v <= 2**63 - 1) or
                (key == "m_lo" and isinstance(v, int) and v == 1) or
                (key == "m_hi" and isinstance(v, int) and 1 <= v <= 2**63 - 1) or
                (key in ("bf16_us", "fp8_us") and 0 < v <= 1e12))
            t.add("8. tuned-table values", classify(rc, out, valid, "" if valid else key), f"{key}={v!r}: rc={rc} {out[-200:]}")

    # 9. FP8 block scales.
    hdr = json.dumps({"w": {"dtype": "F8_E4M3", "shape": [128, 128], "data_offsets": [0, 16384]},
                      "w_scale_inv": {"dtype": "F32", "shape": [1, 1], "data_offsets": [16384, 16388]}}).encode()
    scales = [0.5, 1.0, 1e-30, 7e35, 3e38, 1e36, 0.0, -0.0, -1.0, -1e-30, float("nan"), float("inf"), float("-inf"), 1e-45]
    lines = []
    for i, s in enumerate(scales):
        p = write(f"s{i}.safetensors", st_file(hdr, b"\x38" * 16384 + struct.pack("<f", s)))
        lines.append(f"fp8 {p} w")
    for s, (rc, out) in zip(scales, probe_lines(probe, lines)):
        valid = s == s and 0 < s <= 3.4028235e38 / 448
        t.add("9. FP8 block scales", classify(rc, out, valid, "" if valid else "finite, positive"))

    # 10. reference rules, shard paths, huge tensors: the differential run plus the cases here.
    rc, out = run([sys.executable, os.path.join(HERE, "..", "oracle", "test_safetensors_differential.py"), probe,
                   "--count", "3000", "--seed", str(a.seed)], timeout=600)
    for line in out.splitlines():
        for label, outcome in [("both reject", "clear error"), ("fp8proj rejects, stricter rule", "clear error"),
                               ("both accept, identical", "accepted correctly"),
                               ("both accept, different", "silent coercion"),
                               ("fp8proj rejects, reference accepts", "silent coercion"),
                               ("fp8proj accepts, reference rejects", "silent coercion")]:
            if line.startswith(label + " "):
                for _ in range(int(line.split()[-1])):
                    t.add("10. vs reference parser (mutated files)", outcome)
    if rc is None or rc < 0:
        t.add("10. vs reference parser (mutated files)", classify(rc, out, True))
    ck = os.path.join(tmp, "ck")
    os.makedirs(os.path.join(ck, "sub"), exist_ok=True)
    shard = st_file(b'{"t": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}', b"ab")
    write("ck/s.safetensors", shard)
    write("ck/sub/s.safetensors", shard)
    write("outside.safetensors", shard)
    os.symlink(tmp, os.path.join(ck, "up"))
    os.symlink(os.path.join(tmp, "outside.safetensors"), os.path.join(ck, "l.safetensors"))
    names = [("s.safetensors", True), ("sub/s.safetensors", True), ("./s.safetensors", True),
             (os.path.join(tmp, "outside.safetensors"), False), ("../outside.safetensors", False),
             ("sub/../../outside.safetensors", False), ("up/outside.safetensors", False), ("l.safetensors", False),
             ("/etc/passwd", False), ("", False), ("sub", False)]
    lines = []
    for i, (name, _) in enumerate(names):
        d = os.path.join(ck, f"i{i}")
        os.makedirs(d, exist_ok=True)
        idx = write(f"ck/index{i}.json", json.dumps({"weight_map": {"t": name}}))
        lines.append(f"ck {idx}")
    for (name, ok), (rc, out) in zip(names, probe_lines(probe, lines)):
        t.add("10. index shard paths", classify(rc, out, ok, "ok" if ok else "err"))
    huge = os.path.join(tmp, "huge.safetensors")
    h = b'{"huge": {"dtype": "BF16", "shape": [274877906944], "data_offsets": [0, 549755813888]}}'
    with open(huge, "wb") as f:
        f.write(st_file(h, b""))
    try:
        os.truncate(huge, 8 + len(h) + 549755813888)
        for (rc, out) in probe_lines(probe, [f"bf16 {huge} huge"]):
            t.add("10. huge tensor allocation", classify(rc, out, False, "tensor 'huge'"))
    except OSError:
        pass

    table = t.markdown()
    print(table)
    for f in t.findings:
        print("FINDING", f)
    if a.out:
        with open(a.out, "w") as f:
            f.write(table + "\n")
    bad = sum(r[c] for r in t.rows.values() for c in ("crash", "hang", "sanitizer report", "silent coercion"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
