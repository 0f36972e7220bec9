#!/usr/bin/env python3
"""The fp8proj CLI against hostile arguments, environment values and files (docs/robustness.md,
classes 2, 4, 5, 6, 7, and the CLI rules 8-12 below): every case must end within its time limit
with the expected exit status and a message naming the problem; a signal, a hang or a silent
success is a failure. A case marked quiet must fail before printing anything to stdout.

Usage: test_cli_hostile.py FP8PROJ_BINARY [--table-only]
"""
import concurrent.futures
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
        # --retime: it writes a new table, measures the GPU (never the CPU reference), takes no tuning options.
        ("tune_retime_no_out", ["tune", "--retime", nostamp], {}, False, "give --out"),
        ("tune_retime_cpu", ["tune", "--retime", nostamp, "--cpu", "--out", os.path.join(tmp, "r.json")], {}, False,
         "--cpu"),
        ("tune_retime_margin", ["tune", "--retime", nostamp, "--margin", "5", "--out", os.path.join(tmp, "r.json")],
         {}, False, "--margin"),
        ("tune_force_alone", ["tune", "--cpu", "--force", "--dry-run"], {}, False, "--force applies to --check and --retime"),
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
    one = ["--case", "1x128x128"]  # verify's smallest case
    tiny = ["--shape", "128x128", "--m", "1", "--reps", "1"]  # bench's
    # 8. An option given empty is an error naming it, never "use the default" -- in every form
    # (an empty or blank argument, --opt=, an empty list entry) and every subcommand.
    for cmd, opt in [(["bench", "--cpu"], "--m"), (["bench", "--cpu"], "--tp"), (["bench", "--cpu"], "--model"),
                     (["bench", "--cpu"], "--shape"), (["bench", "--cpu"], "--csv"), (["explain"], "--m"),
                     (["explain"], "--model"), (["explain"], "--shape"), (["verify"], "--case"),
                     (["verify"], "--seed"), (["verify"], "--checkpoint"), (["verify"], "--layers"),
                     (["tune", "--cpu", "--dry-run"], "--model"), (["tune", "--cpu", "--dry-run"], "--tp"),
                     (["tune", "--cpu", "--dry-run"], "--shape"), (["tune", "--cpu", "--dry-run"], "--out"),
                     (["tune", "--cpu"], "--check"), (["tune"], "--from"),
                     (["tune", "--cpu", "--check", nostamp], "--check-m"),
                     (["layer", "--cpu"], "--seqs"), (["layer", "--cpu"], "--tp"), (["layer", "--cpu"], "--model"),
                     (["tp", "explain", "--cpu"], "--tp"), (["tp", "explain", "--cpu"], "--model"),
                     (["tp", "check"], "--what"), (["floor"], "--m"), (["floor"], "--shape"), (["floor"], "--tp"),
                     (["floor"], "--csv")]:
        label = "_".join(c.strip("-") for c in cmd[:2]) + "_" + opt.strip("-").replace("-", "_")
        out.append((f"empty_{label}", cmd + [opt, ""], {}, False, opt, {"quiet": True}))
    out += [
        ("empty_assign", ["bench", "--cpu", "--m=", "--reps", "1"], {}, False, "--m", {"quiet": True}),
        ("empty_blank", ["explain", "--m", "  "], {}, False, "--m", {"quiet": True}),
        ("empty_list_comma", ["explain", "--model", ","], {}, False, "--model", {"quiet": True}),
        ("empty_list_entry", ["explain", "--model", "glm5,,deepseek-v3"], {}, False, "--model", {"quiet": True}),
        ("empty_list_trailing", ["explain", "--m", "1,"], {}, False, "--m", {"quiet": True}),
        ("empty_case_entry", ["verify", "--case", "1x128x128,"], {}, False, "--case", {"quiet": True}),
        ("list_too_long", ["explain", "--m", ",".join(str(i) for i in range(1, 5000))], {}, False, "4096 entries"),
        # 9. Seeds: the one integer rule, 0 .. 2^63-1; nothing wrapped, truncated or read as hex.
        ("seed_negative", ["verify", "--seed", "-1"] + one, {}, False, "--seed", {"quiet": True}),
        ("seed_2_64", ["verify", "--seed", str(2**64)] + one, {}, False, "--seed", {"quiet": True}),
        ("seed_2_63", ["verify", "--seed", str(2**63)] + one, {}, False, "--seed", {"quiet": True}),
        ("seed_hex", ["verify", "--seed", "0x10"] + one, {}, False, "--seed", {"quiet": True}),
        ("seed_fraction", ["verify", "--seed", "1.5"] + one, {}, False, "--seed", {"quiet": True}),
        ("seed_twice", ["verify", "--seed", "1", "--seed", "2"] + one, {}, False, "--seed", {"quiet": True}),
        ("seed_max", ["verify", "--seed", str(2**63 - 1)] + one, {}, True, "meet the numerics contract"),
        # CLI11 converts with strtoll(.., 0): "010" must still be ten, not octal eight.
        ("reps_leading_zero", ["bench", "--cpu", "--reps", "010"] + tiny[:4], {}, True, "median of 10 calls"),
        # 10. tune --budget: a positive, finite number of seconds; it sets --reps, so not both.
        ("budget_zero", ["tune", "--cpu", "--budget", "0", "--dry-run"], {}, False, "--budget", {"quiet": True}),
        ("budget_negative", ["tune", "--cpu", "--budget", "-5", "--dry-run"], {}, False, "--budget", {"quiet": True}),
        ("budget_nan", ["tune", "--cpu", "--budget", "nan", "--dry-run"], {}, False, "--budget", {"quiet": True}),
        ("budget_inf", ["tune", "--cpu", "--budget", "inf", "--dry-run"], {}, False, "--budget", {"quiet": True}),
        ("budget_and_reps", ["tune", "--cpu", "--budget", "10", "--reps", "3", "--dry-run"], {}, False, "--budget",
         {"quiet": True}),
        # 11. Shapes the kernels cannot take, and every other bad argument: refused before any
        # output (no banner, no table header), by the project's FP8 rule (fp8_block_shape_reason).
        ("case_k_unaligned", ["verify", "--case", "1x1x1"], {}, False, "K=1 is not a multiple of 128", {"quiet": True}),
        ("case_n_unaligned", ["verify", "--case", "1x100x128"], {}, False, "N=100 is not a multiple of 16",
         {"quiet": True}),
        ("case_second_bad", ["verify", "--case", "1x128x128", "--case", "4x128x64"], {}, False, "K=64",
         {"quiet": True}),
        ("case_m_zero", ["verify", "--case", "0x128x128"], {}, False, "--case M", {"quiet": True}),
        ("case_too_much_work", ["verify", "--case", "65536x65536x65536"], {}, False, "too large", {"quiet": True}),
        ("tune_shape_unaligned", ["tune", "--cpu", "--shape", "1x1", "--dry-run"], {}, False,
         "K=1 is not a multiple of 128", {"quiet": True}),
        ("tune_shape_second_bad", ["tune", "--cpu", "--shape", "256x256,100x128", "--dry-run"], {}, False, "N=100",
         {"quiet": True}),
        ("bench_shape_second_bad", ["bench", "--cpu", "--shape", "128x128,12x"] + tiny[2:], {}, False, "--shape K",
         {"quiet": True}),
        ("bench_tp_not_dividing", ["bench", "--cpu", "--model", "glm5", "--tp", "3", "--m", "1"], {}, False, "--tp 3",
         {"quiet": True}),
        ("explain_tp_not_dividing", ["explain", "--model", "glm5", "--tp", "1,3"], {}, False, "--tp 3",
         {"quiet": True}),
        ("layer_tp_not_dividing", ["layer", "--cpu", "--tp", "3"], {}, False, "--tp 3", {"quiet": True}),
        ("tp_explain_tp_not_dividing", ["tp", "explain", "--cpu", "--tp", "3"], {}, False, "--tp 3", {"quiet": True}),
        ("model_unknown", ["bench", "--cpu", "--model", "glm6", "--m", "1"], {}, False, "--model: unknown model",
         {"quiet": True}),
        ("layer_two_models", ["layer", "--cpu", "--model", "glm5,deepseek-v3"], {}, False, "--model", {"quiet": True}),
        ("tp_check_what_unknown", ["tp", "check", "--what", "xprojx"], {}, False, "--what", {"quiet": True}),
        ("bench_csv_no_folder", ["bench", "--cpu", "--csv", os.path.join(tmp, "no", "x.csv")] + tiny, {}, False,
         "does not exist", {"quiet": True}),
        ("bench_json_folder", ["bench", "--cpu", "--json", tmp] + tiny, {}, False, "is a folder", {"quiet": True}),
        ("tune_out_csv_same", ["tune", "--cpu", "--max-m", "8", "--out", os.path.join(tmp, "t.json"), "--csv",
                               os.path.join(tmp, "t.json")], {}, False, "name the same file", {"quiet": True}),
        ("tune_from_md_same", ["tune", "--from", nostamp, "--md", nostamp], {}, False, "name the same file",
         {"quiet": True}),
        ("check_csv_is_table", ["tune", "--cpu", "--check", nostamp, "--csv", nostamp], {}, False, "name the same file",
         {"quiet": True}),
        # fp8proj floor: its arguments checked before any work, with or without a GPU; without one
        # (none visible), one line saying nothing was measured -- never a table.
        ("floor_m_zero", ["floor", "--m", "0"], {}, False, "--m", {"quiet": True}),
        ("floor_m_above_bound", ["floor", "--m", "1,65536"], {}, False, "--m 65536", {"quiet": True}),
        ("floor_shape_unaligned", ["floor", "--shape", "256x100"], {}, False, "K=100 is not a multiple of 128",
         {"quiet": True}),
        ("floor_shape_n_unaligned", ["floor", "--shape", "100x256"], {}, False, "N=100", {"quiet": True}),
        ("floor_tp_not_dividing", ["floor", "--model", "glm5", "--tp", "3"], {}, False, "--tp 3", {"quiet": True}),
        ("floor_model_unknown", ["floor", "--model", "glm6"], {}, False, "--model: unknown model", {"quiet": True}),
        ("floor_reps_zero", ["floor", "--reps", "0"], {}, False, "--reps", {"quiet": True}),
        ("floor_launch_once_json", ["floor", "--launch-once", "--json", os.path.join(tmp, "f.json")], {}, False,
         "--launch-once", {"quiet": True}),
        ("floor_launch_once_reps", ["floor", "--launch-once", "--reps", "3"], {}, False, "--launch-once",
         {"quiet": True}),
        ("floor_csv_folder", ["floor", "--csv", tmp], {}, False, "is a folder", {"quiet": True}),
        ("floor_csv_json_same", ["floor", "--csv", os.path.join(tmp, "f.out"), "--json", os.path.join(tmp, "f.out")],
         {}, False, "name the same file", {"quiet": True}),
        ("floor_no_gpu", ["floor", "--shape", "256x256", "--m", "1"], {"CUDA_VISIBLE_DEVICES": ""}, False,
         "nothing was measured", {"quiet": True}),
        ("floor_launch_once_no_gpu", ["floor", "--launch-once", "--shape", "256x256"], {"CUDA_VISIBLE_DEVICES": ""},
         False, "nothing was measured", {"quiet": True}),
        ("floor_shape_and_model", ["floor", "--shape", "256x256", "--model", "glm5"], {}, False, "excludes"),
        # 12. Options that do not apply are errors, not ignored.
        ("explain_shape_and_model", ["explain", "--shape", "256x256", "--model", "glm5"], {}, False, "excludes"),
        ("tune_check_and_max_m", ["tune", "--check", nostamp, "--max-m", "8"], {}, False, "excludes"),
        ("tune_check_m_alone", ["tune", "--cpu", "--dry-run", "--check-m", "1"], {}, False, "requires --check"),
        ("tune_from_and_cpu", ["tune", "--from", nostamp, "--cpu"], {}, False, "excludes"),
        ("verify_m_alone", ["verify", "--m", "5"], {}, False, "requires --checkpoint"),
        ("tune_tp_without_model", ["tune", "--cpu", "--dry-run", "--tp", "1"], {}, False, "--tp", {"quiet": True}),
        ("m_twice", ["explain", "--m", "1", "--m", "2"], {}, False, "--m"),
        # Duplicates are dropped (the first kept): one block per shape, one line per M.
        ("duplicates_dropped", ["explain", "--shape", "256x256,256x256", "--shape", "256x256", "--m", "1,1"], {}, True,
         "M=1:", {"count": ("M=1:", 1)}),
    ]
    return out


def run_case(binary, tmp, case):
    """(name, problems, rc, last line of output) of one case."""
    name, argv, env, ok, text, *extra = case
    extra = extra[0] if extra else {}
    e = dict(os.environ)
    for k in list(e):
        if k.startswith("FP8PROJ_") or k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            del e[k]
    e.update(env)
    try:
        p = subprocess.run([binary] + argv, env=e, capture_output=True, text=True, errors="replace", timeout=60,
                           cwd=tmp)
    except subprocess.TimeoutExpired:
        return name, ["HANG (no exit within 60 s)"], "-", ""
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
    if extra.get("quiet") and p.stdout.strip():
        problems.append("printed before failing (the error must come before any output)")
    if "count" in extra and both.count(extra["count"][0]) != extra["count"][1]:
        problems.append(f"{both.count(extra['count'][0])} x {extra['count'][0]!r}, expected {extra['count'][1]}")
    if name.startswith("table_") and both.count("using defaults") != 1:
        problems.append(f"{both.count('using defaults')} 'using defaults' lines, expected one")
    if "Sanitizer" in both or "runtime error:" in both:
        problems.append("sanitizer report")
    if problems:
        problems[-1] += f"\n    {both[-600:]}"
    return name, problems, p.returncode, both.strip().splitlines()[-1][:150] if both.strip() else ""


def main():
    binary = os.path.abspath(sys.argv[1])
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        all_cases = cases(tmp)
        # Each case is its own process (~0.2 s, most of it loading the CUDA libraries): run a few
        # at once. No case writes a file another reads.
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
            results = list(pool.map(lambda c: run_case(binary, tmp, c), all_cases))
        for name, problems, rc, last in results:
            print(f"{'ok  ' if not problems else 'FAIL'} {name:<28} rc={rc:<3} {last}")
            if problems:
                failures.append(f"{name}: {'; '.join(problems)}")
    print(f"\n{len(all_cases) - len(failures)} of {len(all_cases)} cases as expected")
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
