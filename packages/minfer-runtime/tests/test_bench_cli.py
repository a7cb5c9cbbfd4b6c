"""`minfer bench` is llama-bench: its flags, its lists and ranges, its order of tests, its output formats.

The parsing of llama-bench's values and the printers are unit-tested here; everything a user sees runs
`minfer bench` as a subprocess on tiny synthetic models (test_cli's helpers), always with --backend cpu.
"""

from __future__ import annotations

import csv
import io
import json
import re
import sqlite3
import time

import pytest
from test_cli import assert_one_line_error, call_main, minfer_cli

import minfer
from minfer import bench, cli
from minfer.engine import Engine
from minfer.errors import ContextOverflowError, MinferError
from minfer.gguf_file import GGUFFile
from minfer.models.config import ModelConfig
from minfer.testing.synthetic import scaled

CPU = ("--backend", "cpu")
QUICK = ("-r", "1", *CPU)  # one repetition: these tests check what is printed, not the speed
TABLE_ROW = re.compile(r"^\|(.*)\|$")


@pytest.fixture(scope="module")
def tiny(synthetic_model):
    return synthetic_model("tiny-llama")


@pytest.fixture(scope="module")
def tiny_qwen(synthetic_model):
    return synthetic_model("tiny-qwen2", "F16")


def jsonl(result) -> list[dict]:
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def markdown_rows(stdout: str) -> list[dict[str, str]]:
    """The rows of llama-bench's markdown table (the lines before the build footer), by column."""
    table, _, footer = stdout.partition("\n\n")
    assert footer == f"build: minfer {minfer.__version__}\n"
    lines = table.splitlines()
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True)) for line in lines[2:]]


# -- llama-bench's value syntax ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "values"),
    [
        ("512", [512]),
        ("128,512", [128, 512]),
        ("0,32", [0, 32]),
        ("16-64+16", [16, 32, 48, 64]),
        ("16-60+16", [16, 32, 48]),  # the last step stops at or before `last`
        ("1-8*2", [1, 2, 4, 8]),
        ("3-5", [3, 4, 5]),
        ("1-3,16,32-64*2", [1, 2, 3, 16, 32, 64]),
        ("16,", [16]),  # llama-bench takes one trailing comma
        ("007", [7]),
    ],
)
def test_int_lists_and_ranges_are_llama_benchs(text, values):
    assert bench.parse_int_range(text) == values


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "invalid list"),
        (",", "invalid list"),
        ("1,,2", "invalid list"),
        ("x", "invalid list"),
        ("gl", "invalid list"),
        ("-1", "invalid list"),  # negative only where llama-bench allows it (-ngl)
        ("1*2", "invalid list"),
        ("1-2-3", "invalid list"),
        ("1-4/2", "invalid list"),
        ("1-4|2", "invalid list"),  # llama-bench's [\+|\*] accepts '|' and then throws
        ("\u0663", "invalid list"),  # an Arabic-Indic digit is no ASCII integer
        ("64-16", "ends below its start"),
        ("4-8+0", "the step does not get past 4"),
        ("1-3*1", "the step does not get past 1"),
        ("0-8*2", "the step does not get past 0"),
        ("1-100000", f"more than {bench.MAX_LIST_VALUES} values"),
    ],
)
def test_bad_int_lists_are_refused(text, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        bench.parse_int_range(text)


def test_negative_values_where_llama_bench_allows_them():
    assert bench.parse_int_range("-1", allow_negative=True) == [-1]
    assert bench.parse_int_range("-1-1,99", allow_negative=True) == [-1, 0, 1, 99]


@pytest.mark.parametrize(
    ("parse", "good", "value", "bad"),
    [
        (bench.parse_bools, "0,1", [False, True], "2"),
        (bench.parse_bools, "1", [True], "true"),  # llama-bench's string_split<bool> reads 0 and 1 only
        (bench.parse_choices("none", "layer"), "layer,none", ["layer", "none"], "row"),
        (bench.parse_flash_attn, "on,0,auto,-1", ["on", "0", "auto", "-1"], "maybe"),
        (bench.parse_pairs, "512,128", [(512, 128)], "512"),
        (bench.parse_pairs, "0,16", [(0, 16)], "1,2,3"),
        (bench.parse_models, "a.gguf,b.gguf", ["a.gguf", "b.gguf"], "a.gguf,,b.gguf"),
        (bench.parse_counts, "0,1024", [0, 1024], "1-4"),
        (bench.parse_cpu_masks, "0xff,0F", ["0xff", "0F"], "0xfg"),
        (bench.parse_tensor_split, "3/1,1;1", [[3.0, 1.0], [1.0, 1.0]], "1/x"),
        (bench.parse_tensor_split, "0.5", [[0.5]], "inf"),
        (bench.parse_int_in(-1, 3), "-1", [-1], "4"),
        (bench.bounded("thread count", 1), "1-4", [1, 2, 3, 4], "0,2"),
        (bench.bounded("polling level", maximum=100), "0,50,100", [0, 50, 100], "101"),
    ],
)
def test_other_llama_bench_values(parse, good, value, bad):
    assert parse(good) == value
    with pytest.raises(ValueError):
        parse(bad)


@pytest.mark.parametrize(
    ("parse", "good", "bad", "message"),
    [
        (bench.parse_main_gpu, "0", "1", "device 0"),
        (bench.parse_devices, "auto", "CUDA0", "--backend"),
        (bench.parse_embeddings, "0", "0,1", "not embeddings"),
    ],
)
def test_values_that_would_mislead_are_refused(parse, good, bad, message):
    parse(good)
    with pytest.raises(ValueError, match=f"refused: .*{re.escape(message)}"):
        parse(bad)


def test_every_llama_bench_flag_is_supported_ignored_or_refused():
    """The flags of llama-bench's print_usage (and its README's -mmp, -dio): each is in `minfer bench --help`,
    and each that does not apply is decided once."""
    llama_bench = (  # noqa: SIM905 (one text reads like print_usage; a list literal is one flag a line)
        "-h --help --version --numa -r --repetitions --prio --delay -o --output -oe --output-err --list-devices "
        "-v --verbose --progress --no-warmup -fitt --fit-target -fitc --fit-ctx -rpc --rpc -m --model -hf -hfr "
        "--hf-repo -hff --hf-file -hft --hf-token --offline -p --n-prompt -n --n-gen -pg -d --n-depth -b "
        "--batch-size -ub --ubatch-size -ctk --cache-type-k -ctv --cache-type-v -t --threads -C --cpu-mask "
        "--cpu-strict --poll -ngl --n-gpu-layers -ncmoe --n-cpu-moe -sm --split-mode -mg --main-gpu -nkvo "
        "--no-kv-offload -fa --flash-attn -dev --device -lm --load-mode -lzm --lazy-mode -mmp --mmap -dio "
        "--direct-io -embd --embeddings -ts --tensor-split -ot --override-tensor -nopo --no-op-offload --no-host "
        "--repack"
    ).split()
    result = minfer_cli("bench", "--help")
    assert result.returncode == 0, result.stderr
    listed = set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", result.stdout))
    assert set(llama_bench) <= listed, set(llama_bench) - listed
    decided = [option for flag in (*bench.IGNORED_FLAGS, *bench.REFUSED_FLAGS) for option in flag.options]
    assert len(decided) == len(set(decided))


# -- tests: lists multiply in llama-bench's order ----------------------------------------------------


def test_tests_multiply_in_llama_benchs_order():
    """Thread counts outermost, then depths, then the prompt sizes, generation lengths and pairs; zeros skipped."""
    tests = bench.plan_tests([16, 0, 32], [4, 0], [(8, 2), (0, 0)], depths=[0, 64], threads=[1, 2])
    expected = []
    for threads in (1, 2):
        for depth in (0, 64):
            expected += [(16, 0), (32, 0), (0, 4), (8, 2)]
            expected[-4:] = [bench.BenchTest(p, g, depth, threads) for p, g in expected[-4:]]
    assert tests == expected
    assert [t.name for t in tests[4:8]] == ["pp16 @ d64", "pp32 @ d64", "tg4 @ d64", "pp8+tg2 @ d64"]


def test_zero_sizes_are_no_tests():
    assert bench.plan_tests([0], [128]) == [bench.BenchTest(0, 128)]
    assert bench.plan_tests([512], [0]) == [bench.BenchTest(512, 0)]
    assert bench.plan_tests([0], [0]) == []


@pytest.mark.parametrize(
    ("test", "name"),
    [
        (bench.BenchTest(512, 0), "pp512"),
        (bench.BenchTest(0, 128), "tg128"),
        (bench.BenchTest(512, 128), "pp512+tg128"),
        (bench.BenchTest(0, 128, 2048), "tg128 @ d2048"),
    ],
)
def test_tests_are_named_as_llama_bench_names_them(test, name):
    assert test.name == name


@pytest.mark.parametrize(
    ("backend", "gpu_layers", "no_kv_offload", "message"),
    [
        ("cpu", [0, 5, 99, -1], [True], None),  # on the CPU everything runs on the host, as asked
        ("cuda", [-1, 3, 99], [False], None),  # 3 is more than the 2 layers: all of them and the output
        ("cuda", [0], [], "-ngl 0 keeps every layer on the CPU"),
        ("cuda", [1], [], "-ngl 1 splits the model"),
        ("cuda", [2], [], "-ngl 2 splits the model"),  # the layers, but the output stays on the CPU
        ("cuda", [], [True], "-nkvo 1 keeps the KV cache in host memory"),
    ],
)
def test_placement_flags_are_checked_against_the_backend(backend, gpu_layers, no_kv_offload, message):
    if message is None:
        bench.check_placement(backend, 2, gpu_layers, no_kv_offload)
    else:
        with pytest.raises(MinferError, match=re.escape(message)):
            bench.check_placement(backend, 2, gpu_layers, no_kv_offload)


def test_a_test_beyond_the_context_is_refused_naming_the_model(tiny):
    engine = Engine(tiny, backend="cpu")
    with pytest.raises(ContextOverflowError, match=re.escape(f"{tiny}: test pp8 @ d505 needs 513 tokens")):
        bench.check_tests(engine, [bench.BenchTest(8, 0, 505)], 1)
    bench.check_tests(engine, [bench.BenchTest(8, 0, 504)], 1)


# -- what a decode step reads -----------------------------------------------------------------------


def float32_decode_bytes(path) -> int:
    """4 bytes per weight value a decode step reads: every weight, but one row of an embedding not tied to the head."""
    gguf = GGUFFile(path)
    config = ModelConfig.from_gguf(gguf)
    values = {name: gguf.tensor(name).n_elements for name in config.expected_tensors()}
    if not config.tied_output:
        values["token_embd.weight"] //= config.vocab_size
    return 4 * sum(values.values())


@pytest.mark.parametrize("tied", [True, False])
def test_cpu_weight_traffic_counts_float32_values(synthetic_model, tied):
    """The CPU backend reads float32 weights (dequantized at load), not the file's quantized bytes."""
    path = synthetic_model(scaled("tiny-llama", tied_output=tied), "Q4_0")
    gguf = GGUFFile(path)
    assert ModelConfig.from_gguf(gguf).tied_output is tied
    engine = Engine(path, backend="cpu")
    assert bench.decode_weight_bytes(engine) == float32_decode_bytes(path)
    file_bytes = sum(gguf.tensor(name).nbytes for name in ModelConfig.from_gguf(gguf).expected_tensors())
    assert bench.decode_weight_bytes(engine) > file_bytes  # what the column used to count


# -- output formats -------------------------------------------------------------------------------


def result(**changes) -> bench.BenchResult:
    fields = {
        "model_filename": "models/m.gguf",
        "model_type": 'llama "7B" it\'s',  # quotes of both kinds: csv and sql must escape them
        "model_size": 2**31,
        "model_n_params": 6_740_000_000,
        "backends": "cpu",
        "gpu_info": "",
        "n_threads": 8,
        "cache_type": "f16",
        "n_prompt": 0,
        "n_gen": 128,
        "n_depth": 0,
        "test_time": "2026-12-01T00:00:00Z",
        "samples_ns": (1_000_000_000, 2_000_000_000),
        "weight_bytes_per_token": 10**9,
        **changes,
    }
    return bench.BenchResult(**fields)


def printed(
    output_format: str, results: list[bench.BenchResult], threads_column: bool = True, cache_type_columns: bool = False
) -> str:
    out = io.StringIO()
    printer = bench.make_printer(
        output_format, out.write, threads_column=threads_column, cache_type_columns=cache_type_columns
    )
    printer.header()
    for r in results:
        printer.test(r)
    printer.footer()
    return out.getvalue()


def test_statistics_are_llama_benchs():
    r = result()
    assert r.samples_ts == [128.0, 64.0]
    assert r.avg_ts == 96.0 and r.stddev_ts == pytest.approx(45.254834)  # sample standard deviation
    assert r.avg_ns == 1_500_000_000 and r.stddev_ns == 707_106_781
    assert r.weight_gb_per_second == 96.0
    assert result(n_prompt=512, n_gen=0).weight_gb_per_second is None
    assert result(n_prompt=512).weight_gb_per_second is None  # pp+tg: not a decode rate
    assert result(n_prompt=512).samples_ts == [640.0, 320.0]  # pp+tg counts both, as llama-bench


def test_markdown_is_llama_benchs_table():
    text = printed("md", [result(), result(n_depth=2048, n_prompt=512, n_gen=0)])
    lines = text.splitlines()
    assert lines[0] == (
        "| model                          |       size |     params | backend    | threads |            test |"
        "                  t/s | weights GB/s |"
    )
    assert lines[1] == (
        "| ------------------------------ | ---------: | ---------: | ---------- | ------: | --------------: |"
        " -------------------: | -----------: |"
    )
    assert lines[2] == (
        '| llama "7B" it\'s                |   2.00 GiB |     6.74 B | cpu        |       8 |           tg128 |'
        "        96.00 ± 45.25 |         96.0 |"
    )
    assert "pp512 @ d2048" in lines[3] and lines[3].endswith("|              |")
    assert lines[4:] == ["", f"build: minfer {minfer.__version__}"]
    assert "threads" not in printed("md", [result()], threads_column=False)


def test_markdown_shows_the_cache_types_as_llama_bench_does():
    """llama-bench's type_k and type_v columns: width 6, right-aligned, after the threads."""
    lines = printed("md", [result(cache_type="f32")], cache_type_columns=True).splitlines()
    assert lines[0].startswith("| model ") and "| threads | type_k | type_v |            test |" in lines[0]
    assert "| ------: | -----: | -----: | --------------: |" in lines[1]
    assert "|       8 |    f32 |    f32 |           tg128 |" in lines[2]


def test_csv_quotes_every_value():
    rows = list(csv.reader(io.StringIO(printed("csv", [result()]))))
    assert rows[0] == list(bench.FIELDS)
    values = dict(zip(rows[0], rows[1], strict=True))
    assert values["model_type"] == 'llama "7B" it\'s'
    assert values["avg_ts"] == "96.000000" and values["n_threads"] == "8" and values["avg_ns"] == "1500000000"
    assert values["test"] == "tg128" and values["weight_gb_per_second"] == "96.000000"
    assert values["cpu_info"] == bench.cpu_info() and values["gpu_info"] == ""
    assert values["type_k"] == values["type_v"] == "f16"


def test_json_and_jsonl_carry_the_samples():
    records = json.loads(printed("json", [result(), result(n_gen=64)]))
    lines = [json.loads(line) for line in printed("jsonl", [result(), result(n_gen=64)]).splitlines()]
    assert records == lines
    assert list(records[0]) == [*bench.FIELDS, "samples_ns", "samples_ts"]
    assert records[0]["samples_ns"] == [1_000_000_000, 2_000_000_000] and records[0]["samples_ts"] == [128.0, 64.0]
    assert records[0]["n_threads"] == 8 and records[1]["test"] == "tg64"
    assert records[0]["type_k"] == records[0]["type_v"] == "f16"
    assert json.loads(printed("json", [])) == []


def test_sql_loads_into_sqlite():
    database = sqlite3.connect(":memory:")
    database.executescript(printed("sql", [result(), result(n_prompt=512, n_gen=0)]))
    query = "SELECT model_type, n_threads, type_k, type_v, avg_ts, weight_gb_per_second, test FROM llama_bench"
    assert database.execute(query).fetchall() == [
        ('llama "7B" it\'s', 8, "f16", "f16", 96.0, 96.0, "tg128"),
        ('llama "7B" it\'s', 8, "f16", "f16", 384.0, None, "pp512"),
    ]
    types = {row[1]: row[2] for row in database.execute("PRAGMA table_info(llama_bench)")}
    assert types == {field: bench.SQL_TYPES[kind] for field, kind in bench.FIELDS.items()}


def test_none_prints_nothing():
    assert bench.make_printer("none", print, threads_column=True, cache_type_columns=True) is None


# -- the command: what a user sees ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("types_k", "types_v", "expected"),
    [
        ([], [], ["f32"]),  # minfer's default
        (["f16", "f32"], [], ["f16", "f32"]),  # one list alone: each type for K and V both
        ([], ["f16"], ["f16"]),
        (["f16"], ["f16"], ["f16"]),
        (["f16", "f16"], ["f16"], ["f16", "f16"]),  # llama-bench's crossing: twice (f16, f16), so twice the tests
    ],
)
def test_cache_type_lists_cross_as_llama_benchs_into_one_type_each(types_k, types_v, expected):
    assert bench.cache_types(types_k, types_v) == expected


@pytest.mark.parametrize(
    ("types_k", "types_v", "pair"),
    [(["f16", "f32"], ["f16", "f32"], "K f16 with V f32"), (["f16"], ["f32"], "K f16 with V f32"),
     (["f32"], ["f32", "f16"], "K f32 with V f16")],
)  # fmt: skip
def test_cache_type_lists_that_cross_into_two_types_are_refused_saying_how_to_ask(types_k, types_v, pair):
    with pytest.raises(ValueError) as error:
        bench.cache_types(types_k, types_v)
    message = str(error.value)
    assert f"-ctk {','.join(types_k)} -ctv {','.join(types_v)}" in message and pair in message
    assert "crosses the two lists" in message and "share one type" in message
    wanted = ",".join(dict.fromkeys([*types_k, *types_v]))
    assert f"give the types to one flag (-ctk {wanted} measures each for both K and V)" in message


def test_cache_type_values_are_minfers_and_llama_cpps_others_are_named():
    assert bench.parse_cache_types("f32,f16,") == ["f32", "f16"]
    with pytest.raises(ValueError, match=re.escape("'bf16' is llama.cpp's, not supported by minfer")):
        bench.parse_cache_types("f16,bf16")
    with pytest.raises(ValueError, match=r"unknown KV cache type 'F16' \(choose from f32, f16\)"):
        bench.parse_cache_types("F16")


def test_zero_skips_a_kind_of_test(tiny):
    assert [r["test"] for r in jsonl(minfer_cli("bench", tiny, "-p", "0", "-n", "4", "-o", "jsonl", *QUICK))] == ["tg4"]
    assert [r["test"] for r in jsonl(minfer_cli("bench", tiny, "-p", "8", "-n", "0", "-o", "jsonl", *QUICK))] == ["pp8"]
    assert_one_line_error(minfer_cli("bench", tiny, "-p", "0", "-n", "0", *QUICK), "nothing to measure", "-p 0")


def test_lists_ranges_depths_threads_and_pairs_multiply_in_llama_benchs_order(tiny):
    args = ("-p", "8-16+8", "-n", "1-4*2", "-pg", "8,2", "-d", "0,32", "-t", "1,2", "-o", "jsonl")
    records = jsonl(minfer_cli("bench", tiny, *args, *QUICK))
    names = ["pp8", "pp16", "tg1", "tg2", "tg4", "pp8+tg2"]
    assert [(r["n_threads"], r["n_depth"], r["test"]) for r in records] == [
        (threads, depth, name + (f" @ d{depth}" if depth else ""))
        for threads in (1, 2)
        for depth in (0, 32)
        for name in names
    ]
    pair = records[5]
    assert (pair["n_prompt"], pair["n_gen"]) == (8, 2)
    assert pair["avg_ts"] == pytest.approx(1e9 * 10 / pair["avg_ns"])  # both kinds of tokens count: 10 a run


def test_flags_repeat_into_lists(tiny):
    records = jsonl(
        minfer_cli("bench", tiny, "-p", "8", "-p", "16", "-n", "0", "-r", "1", "-r", "2", "-o", "jsonl", *CPU)
    )
    assert [r["test"] for r in records] == ["pp8", "pp16"]
    assert [len(r["samples_ns"]) for r in records] == [2, 2]  # -r is single-valued: the last one counts


def test_models_as_flags_and_argument(tiny, tiny_qwen):
    args = ("-m", tiny_qwen, "-m", f"{tiny},{tiny_qwen}", "-p", "8", "-n", "0", "-o", "jsonl", *QUICK)
    records = jsonl(minfer_cli("bench", tiny, *args))
    assert [r["model_filename"] for r in records] == [str(tiny), str(tiny_qwen), str(tiny), str(tiny_qwen)]
    assert {r["model_type"] for r in records} == {GGUFFile(tiny).name, GGUFFile(tiny_qwen).name}


def test_each_cache_type_is_a_load_running_every_test_in_llama_benchs_order(tiny, monkeypatch, capsys):
    """llama-bench's loops: the type pairs outside the thread counts and depths, each pair a context of its own;
    in minfer each cache type is an Engine of its own, and the records carry llama-bench's type_k and type_v."""
    loads = []

    def engine(*args, **kwargs):
        loads.append(kwargs["cache_type"])
        return Engine(*args, **kwargs)

    monkeypatch.setattr(cli, "Engine", engine)
    argv = ["bench", str(tiny), "-ctk", "f32,f16", "-p", "8", "-n", "2", "-t", "1,2", "-o", "jsonl", *QUICK]
    assert call_main(argv) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert loads == ["f32", "f16"]
    assert [(r["type_k"], r["type_v"], r["n_threads"], r["test"]) for r in records] == [
        (cache_type, cache_type, threads, test)
        for cache_type in ("f32", "f16")
        for threads in (1, 2)
        for test in ("pp8", "tg2")
    ]


def test_the_other_flag_alone_sets_both_types_too(tiny):
    records = jsonl(
        minfer_cli("bench", tiny, "-ctv", "f16", "-ctv", "f16", "-p", "8", "-n", "0", "-o", "jsonl", *QUICK)
    )
    assert [(r["type_k"], r["type_v"], r["test"]) for r in records] == [("f16", "f16", "pp8")] * 2


def test_crossed_cache_types_are_a_usage_error(tiny):
    result = minfer_cli("bench", tiny, "-ctk", "f16,f32", "-ctv", "f16,f32", "-p", "8", "-n", "0", *QUICK)
    line = assert_one_line_error(result, "-ctk f16,f32 -ctv f16,f32", "pairs K f16 with V f32", "-ctk f16,f32 measures")
    assert result.returncode == 2 and line.startswith("minfer bench: error: ")


@pytest.mark.parametrize(("args", "columns"), [((), ("f32", "f32")), (("-ctk", "f16"), None)])
def test_markdown_shows_the_cache_types_unless_they_are_llama_benchs_f16(tiny, args, columns):
    result = minfer_cli("bench", tiny, *args, "-p", "8", "-n", "0", *QUICK)
    assert result.returncode == 0, result.stderr
    [row] = markdown_rows(result.stdout)
    assert (row.get("type_k"), row.get("type_v")) == (columns or (None, None))


def test_markdown_shows_threads_on_the_cpu(tiny):
    result = minfer_cli("bench", tiny, "-p", "8", "-n", "2", "-t", "1,2", *QUICK)
    assert result.returncode == 0, result.stderr
    rows = markdown_rows(result.stdout)
    assert [(row["threads"], row["test"]) for row in rows] == [("1", "pp8"), ("1", "tg2"), ("2", "pp8"), ("2", "tg2")]
    assert rows[0]["weights GB/s"] == "" and float(rows[1]["weights GB/s"]) > 0
    assert result.stderr == ""


@pytest.mark.parametrize("output_format", ["csv", "json", "jsonl", "sql"])
def test_every_format_reports_the_threads(tiny, output_format):
    result = minfer_cli("bench", tiny, "-p", "8", "-n", "2", "-t", "1", "-o", output_format, *QUICK)
    assert result.returncode == 0, result.stderr
    if output_format == "csv":
        records = list(csv.DictReader(io.StringIO(result.stdout)))
    elif output_format == "json":
        records = json.loads(result.stdout)
    elif output_format == "jsonl":
        records = [json.loads(line) for line in result.stdout.splitlines()]
    else:
        database = sqlite3.connect(":memory:")
        database.executescript(result.stdout)
        database.row_factory = sqlite3.Row
        records = [dict(row) for row in database.execute("SELECT * FROM llama_bench")]
    assert [(str(r["n_threads"]), r["test"]) for r in records] == [("1", "pp8"), ("1", "tg2")]
    assert all(r["backends"] == "cpu" and float(r["avg_ts"]) > 0 for r in records)


def test_cpu_weight_traffic_is_float32_bytes_times_speed(tiny):
    record = jsonl(minfer_cli("bench", tiny, "-p", "0", "-n", "4", "-o", "jsonl", *QUICK))[0]
    assert record["weight_gb_per_second"] == pytest.approx(float32_decode_bytes(tiny) * record["avg_ts"] / 1e9)


def test_output_on_stderr(tiny):
    result = minfer_cli("bench", tiny, "-p", "8", "-n", "0", "-o", "none", "-oe", "md", *QUICK)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert [row["test"] for row in markdown_rows(result.stderr)] == ["pp8"]
    both = minfer_cli("bench", tiny, "-p", "8", "-n", "0", "-o", "json", "-oe", "jsonl", *QUICK)
    assert json.loads(both.stdout)[0]["test"] == json.loads(both.stderr)["test"] == "pp8"


def test_progress_lines_are_llama_benchs(tiny):
    result = minfer_cli("bench", tiny, "-p", "8", "-n", "2", "-d", "4", "-r", "2", "--progress", "-o", "jsonl", *CPU)
    assert result.returncode == 0, result.stderr
    steps = ["starting", "warmup prompt run", "depth run 1/2", "prompt run 1/2", "depth run 2/2", "prompt run 2/2"]
    steps += [s.replace("prompt", "generation") for s in steps]
    assert result.stderr.splitlines() == [
        f"minfer bench: benchmark {1 + i // 6}/2: {step}" for i, step in enumerate(steps)
    ]
    quiet = minfer_cli("bench", tiny, "-p", "8", "-n", "0", "--progress", "--no-warmup", *QUICK)
    assert quiet.stderr.splitlines() == [
        "minfer bench: benchmark 1/1: starting",
        "minfer bench: benchmark 1/1: prompt run 1/1",
    ]


def test_delay_waits_before_each_test(tiny):
    started = time.monotonic()
    result = minfer_cli("bench", tiny, "-p", "8", "-n", "2", "--delay", "1", *QUICK)
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started >= 2


# A valid value of every ignored flag (None: it takes none).
IGNORED_VALUES = {
    "--numa": "distribute", "--prio": "1", "-v": None, "-fitt": "1024", "-fitc": "4096", "--offline": None,
    "-b": "2048", "-ub": "256,512", "-C": "0xff", "--cpu-strict": "1",
    "--poll": "0-100+50", "-ngl": "0", "-ncmoe": "0", "-sm": "row", "-mg": "0", "-nkvo": "1", "-fa": "on",
    "-dev": "auto", "-lm": "mmap", "-lzm": "on", "-mmp": "0", "-dio": "1", "-embd": "0", "-ts": "3/1",
    "-nopo": "1", "--no-host": "1", "--repack": "0",
}  # fmt: skip


def test_flags_with_no_effect_are_accepted_and_named_on_one_line(tiny):
    assert set(IGNORED_VALUES) == {flag.options[0] for flag in bench.IGNORED_FLAGS}
    args = [part for flag, value in IGNORED_VALUES.items() for part in (flag, *([value] if value else []))]
    result = minfer_cli("bench", tiny, "-p", "8", "-n", "0", *args, "-o", "jsonl", *QUICK)
    assert result.returncode == 0, result.stderr
    assert [r["test"] for r in jsonl(result)] == ["pp8"]  # ignored lists do not multiply the tests
    given = ", ".join(flag if value is None else f"{flag} {value}" for flag, value in IGNORED_VALUES.items())
    assert result.stderr == f"minfer bench: ignored (no effect in minfer): {given}\n"


def test_long_spellings_of_ignored_flags_are_named_as_given(tiny):
    result = minfer_cli("bench", tiny, "-p", "8", "-n", "0", "--n-gpu-layers", "99", "--flash-attn", "1", *QUICK)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "minfer bench: ignored (no effect in minfer): --n-gpu-layers 99, --flash-attn 1\n"


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["-ngl", "x"], ["-ngl/--n-gpu-layers", "'x'"]),
        (["-ngl"], ["-ngl/--n-gpu-layers", "expected one argument"]),
        (["-nkvo", "2"], ["-nkvo/--no-kv-offload", "'2'"]),
        (["-fa", "maybe"], ["-fa/--flash-attn", "'maybe'"]),
        (["-sm", "diagonal"], ["-sm/--split-mode", "'diagonal'"]),
        (["-ctk", "f8"], ["-ctk/--cache-type-k", "unknown KV cache type 'f8'", "f32, f16"]),
        (["-ctv", "f16,q8_0"], ["-ctv/--cache-type-v", "'q8_0' is llama.cpp's, not supported by minfer"]),
        (["-C", "0xzz"], ["-C/--cpu-mask", "'0xzz'"]),
        (["-ts", "a/b"], ["-ts/--tensor-split", "'a/b'"]),
        (["--prio", "7"], ["--prio", "'7'"]),
        (["--poll", "101"], ["--poll", "'101'"]),
        (["-b", "0"], ["-b/--batch-size", "'0'"]),
        (["-mg", "1"], ["-mg/--main-gpu", "refused", "CUDA_VISIBLE_DEVICES"]),
        (["-dev", "CUDA0/CUDA1"], ["-dev/--device", "refused", "--backend"]),
        (["-embd", "1"], ["-embd/--embeddings", "refused", "logits"]),
        (["-p", "16-64+0"], ["-p/--n-prompt", "'16-64+0'"]),
        (["-d", "-1"], ["-d/--n-depth/--depth"]),
        (["-t", "0"], ["-t/--threads", "at least 1"]),
        (["-pg", "512"], ["-pg", "'512'"]),
        (["-m", "a.gguf,,b.gguf"], ["-m/--model", "empty model name"]),
        (["-r", "0"], ["-r/--repetitions", "'0'"]),
        (["-o", "xml"], ["-o/--output", "'xml'"]),
        (["-oe", "html"], ["-oe/--output-err", "'html'"]),
        (["--delay", "-1"], ["--delay"]),
    ],
)
def test_bad_values_are_usage_errors_naming_the_flag(tiny, args, fragments):
    result = minfer_cli("bench", tiny, *args, *QUICK)
    line = assert_one_line_error(result, *fragments)
    assert result.returncode == 2 and line.startswith("minfer bench: error: argument ")


@pytest.mark.parametrize("flag", [flag for flag in bench.REFUSED_FLAGS], ids=lambda flag: flag.options[0])
def test_flags_that_would_mislead_are_refused_by_name(tiny, flag):
    value = ["s3cr3t-value"] if flag.metavar is not None else []
    for option in flag.options:
        result = minfer_cli("bench", tiny, option, *value, *QUICK)
        line = assert_one_line_error(result, "/".join(flag.options), "refused", flag.reason)
        assert "s3cr3t" not in line  # a token (-hft) is never echoed
        assert result.returncode == 2


def test_ngl_is_no_longer_read_as_n(tiny):
    """`-ngl 0` was `-n gl 0`: "argument -n/--n-gen: not an integer: 'gl'"."""
    result = minfer_cli("bench", tiny, "-ngl", "0", "-p", "8", "-n", "2", "-o", "jsonl", *QUICK)
    assert [r["test"] for r in jsonl(result)] == ["pp8", "tg2"]
    assert result.stderr == "minfer bench: ignored (no effect in minfer): -ngl 0\n"


def test_models_that_do_not_load_are_one_line_naming_them(tiny, tmp_path):
    missing = tmp_path / "missing.gguf"
    result = minfer_cli("bench", "-m", f"{tiny},{missing}", "-p", "8", "-n", "0", *QUICK)
    assert_one_line_error(result, str(missing), "no such file")  # before the first model's tests, not after
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"GGUF" + bytes(60))
    assert_one_line_error(minfer_cli("bench", corrupt, "-p", "8", "-n", "0", *QUICK), str(corrupt))


def test_a_depth_beyond_the_context_is_one_line_naming_the_model_and_flags(tiny):
    line = assert_one_line_error(
        minfer_cli("bench", tiny, "-p", "0", "-n", "4", "-d", "0,600", "-ngl", "99", *QUICK),
        str(tiny),
        "tg4 @ d600 needs 604 tokens",
        "context size 512",
        "-d",
        "--ctx-size",
    )
    assert "ignored" not in line  # the ignored flags' line waits for the checks: the error is the only line


def test_version(tiny):
    result = minfer_cli("bench", "--version")
    assert result.returncode == 0 and f"minfer-runtime {minfer.__version__}" in result.stdout
