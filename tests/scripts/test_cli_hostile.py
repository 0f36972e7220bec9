#!/usr/bin/env python3
"""The fp8proj CLI against hostile arguments, environment values and files (docs/robustness.md,
classes 2, 4, 5, 6, 7): every case must end within its time limit with the expected exit status
and a message naming the problem; a signal, a hang or a silent success is a failure.

Usage: test_cli_hostile.py FP8PROJ_BINARY [--table-only]
"""
import os
import subprocess
import sys
import tempfile

BIG = str(2**62)


def cases(tmp):
    fifo = os.path.join(tmp, "fifo")
    os.mkfifo(fifo)
    nostamp = os.path.join(tmp, "nostamp.json")
    with open(nostamp, "w") as f:
        f.write('{"format": "fp8proj-tune/1", "shapes": []}')
    corrupt = os.path.join(tmp, "corrupt.json")
    with open(corrupt, "w") as f:
        f.write('{"format": "fp8proj-tune/1", "stamp": {"sm_count": true')
    types = os.path.join(tmp, "types.json")
    with open(types, "w") as f:
        f.write('{"format": "fp8proj-tune/1", "stamp": {"gpu_name": "X", "sm_count": 12.5, "driver": "", '
                '"cuda_runtime": "", "cublaslt": "", "fp8proj_version": ""}, "shapes": []}')
    deep = os.path.join(tmp, "deep.json")
    with open(deep, "w") as f:
        f.write("[" * 100000 + "]" * 100000)
    # (name, argv, extra environment, expect success?, text that must appear in stdout+stderr)
    out = []
    # 2. the tuned table: any problem -> exit 0, one log line, defaults.
    for label, path in [("missing_stamp", nostamp), ("directory", tmp), ("fifo", fifo), ("corrupt", corrupt),
                        ("wrong_types", types), ("deep", deep), ("device", "/dev/zero"),
                        ("absent", os.path.join(tmp, "absent.json"))]:
        out.append((f"table_{label}", ["info"], {"FP8PROJ_TUNE_FILE": path}, True, "using defaults"))
    # 5. launcher variables are read by multi-process runs (a GPU); tests/cpu/hostile_input_test.cpp
    # checks them (LauncherVariablesAreRangeChecked). The layer's knobs:
    for var, val in [("FP8PROJ_MIN_FP8_TOKENS", "12.5"), ("FP8PROJ_MIN_FP8_TOKENS", "99999999999999999999"),
                     ("FP8PROJ_DECODE_CEILING", "-1"), ("FP8PROJ_DECODE_CEILING", "true")]:
        out.append((f"env_{var}_{val}", ["explain", "--fp8", "--shape", "256x256", "--m", "1"], {var: val}, False, var))
    # 6. CLI integers: bounded, not wrapped, not silently defaulted.
    out += [
        ("m_range_huge", ["explain", "--m", f"1-{BIG}"], {}, False, "--m range end"),
        ("m_value_huge", ["explain", "--m", "9223372036854775808"], {}, False, "--m"),
        ("m_negative", ["explain", "--m", "-5"], {}, False, "--m"),
        ("m_fraction", ["explain", "--m", "1.5"], {}, False, "--m"),
        ("shape_overflow", ["explain", "--shape", "144115188075855873x128"], {}, False, "--shape N"),
        ("shape_elements", ["explain", "--shape", "2147483648x2147483648"], {}, False, "weight elements"),
        ("tp_wrap", ["explain", "--tp", "4294967297"], {}, False, "--tp"),
        ("tp_negative", ["explain", "--tp", "-4294967292"], {}, False, "--tp"),
        ("tp_cmd_wrap", ["tp", "explain", "--cpu", "--tp", "4294967297"], {}, False, "--tp"),
        ("bench_reps", ["bench", "--cpu", "--m", "1", "--reps", "-1"], {}, False, "--reps"),
        ("layer_seqlen", ["layer", "--cpu", "--seqlen", "-5"], {}, False, "--seqlen"),
        ("layer_seqs", ["layer", "--cpu", "--seqs", "0"], {}, False, "--seqs"),
        ("tune_max_m_zero", ["tune", "--cpu", "--max-m", "0", "--dry-run"], {}, False, "--max-m"),
        ("tune_max_m_huge", ["tune", "--cpu", "--max-m", BIG, "--dry-run"], {}, False, "--max-m"),
        ("tune_first_bucket", ["tune", "--cpu", "--first-bucket", BIG, "--dry-run"], {}, False, "--first-bucket"),
        ("tune_reps_bool", ["tune", "--cpu", "--reps", "true", "--dry-run"], {}, False, "--reps"),
        # 7. the margin: finite, 0-100.
        ("tune_margin_nan", ["tune", "--cpu", "--margin", "nan", "--dry-run"], {}, False, "--margin"),
        ("tune_margin_negative", ["tune", "--cpu", "--margin", "-100", "--dry-run"], {}, False, "--margin"),
        ("tune_margin_inf", ["tune", "--cpu", "--margin", "inf", "--dry-run"], {}, False, "--margin"),
        ("tune_tolerance_nan", ["tune", "--cpu", "--check", nostamp, "--tolerance", "nan"], {}, False, "--tolerance"),
        ("verify_case", ["verify", "--case", "99999999999999999999x8x8"], {}, False, "--case M"),
        # Writing to a full disk is an error, not a silent exit 0.
        ("bench_csv_dev_full", ["bench", "--cpu", "--m", "1", "--reps", "1", "--shape", "128x128", "--csv", "/dev/full"],
         {}, False, "failed"),
        # Bad tables given explicitly are errors (not a fallback: the user asked for that file).
        ("tune_from_fifo", ["tune", "--from", fifo, "--md", os.path.join(tmp, "x.md")], {}, False, "named pipe"),
        ("tune_from_deep", ["tune", "--from", deep, "--md", os.path.join(tmp, "x.md")], {}, False, "nested"),
        # Accepted correctly: the limits themselves.
        ("m_range_max", ["explain", "--shape", "256x256", "--m", f"1-{2**31}"], {}, True, "M=2147483648"),
        ("tune_margin_ok", ["tune", "--cpu", "--margin", "0", "--max-m", "8", "--dry-run"], {}, True, "plan:"),
    ]
    return out


def main():
    binary = os.path.abspath(sys.argv[1])
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        all_cases = cases(tmp)
        for name, argv, env, ok, text in all_cases:
            e = dict(os.environ)
            for k in list(e):
                if k.startswith("FP8PROJ_") or k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
                    del e[k]
            e.update(env)
            try:
                p = subprocess.run([binary] + argv, env=e, capture_output=True, text=True, errors="replace",
                                   timeout=60, cwd=tmp)
            except subprocess.TimeoutExpired:
                failures.append(f"{name}: HANG (no exit within 60 s)")
                continue
            both = p.stdout + p.stderr
            problems = []
            if p.returncode < 0:
                problems.append(f"killed by signal {-p.returncode}")
            elif ok and p.returncode != 0:
                problems.append(f"exit {p.returncode}, expected 0")
            elif not ok and p.returncode == 0:
                problems.append("exit 0, expected an error")
            if text not in both:
                problems.append(f"output lacks {text!r}")
            if name.startswith("table_") and both.count("using defaults") != 1:
                problems.append(f"{both.count('using defaults')} 'using defaults' lines, expected one")
            if "Sanitizer" in both or "runtime error:" in both:
                problems.append("sanitizer report")
            status = "ok  " if not problems else "FAIL"
            print(f"{status} {name:<28} rc={p.returncode:<3} {both.strip().splitlines()[-1][:150] if both.strip() else ''}")
            if problems:
                failures.append(f"{name}: {'; '.join(problems)}\n    {both[-600:]}")
    print(f"\n{len(all_cases) - len(failures)} of {len(all_cases)} cases as expected")
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
