from shunter.engine.sim.report import COLUMNS, format_table


def test_table_is_labelled_and_shows_missing_values_as_dashes() -> None:
    row = {key: 0.5 for _, key, _ in COLUMNS}
    row.update(policy="lvf", rps=4.0, rotations=7, p99_itl_s=None)
    lines = format_table([row], "qwen2.5-32b on gh200").splitlines()
    assert lines[0] == "SIMULATED: qwen2.5-32b on gh200"
    header, body = lines[1].split(), lines[3].split()
    assert header[:5] == ["policy", "rps", "TTFT%", "TBT%", "both%"]
    assert body[:5] == ["lvf", "4.0", "50.0%", "50.0%", "50.0%"]
    assert "-" in body and "7" in body
    assert len(lines[1]) == len(lines[3])
