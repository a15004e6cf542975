"""Perseus's CSV format, its errors, and the downward-scan stop rule."""
import pytest

from schedulers.pipeline_energy import DownwardScan, Instruction, PipelineProfile, ProfileError, ProfileRow

SEED_CSV = """stage,instruction,frequency,time,energy
0,forward,1740,0.09373254776000976,28.4944
0,forward,1725,0.09390360514322917,28.434366666666666
0,backward,1740,0.24533510557810465,69.5691
0,backward,1725,0.24538559118906658,69.2552
1,forward,1740,0.1,30.0
1,backward,690,0.4184921979904175,68.12243333333333
1,backward,660,0.4306272824605306,69.39623333333334
"""


def test_reads_and_writes_perseus_csv(tmp_path):
    path = tmp_path / "seed.csv"
    path.write_text(SEED_CSV)
    profile = PipelineProfile.read_csv(path, p2p_power_w=70.0)
    assert profile.num_stages == 2 and profile.p2p_power_w == 70.0
    assert profile.fastest(0, Instruction.BACKWARD).energy_j == 69.5691
    assert [r.frequency_mhz for r in profile.options(1, Instruction.BACKWARD)] == [690, 660]
    again = tmp_path / "again.csv"
    profile.write_csv(again)
    assert PipelineProfile.read_csv(again, 70.0) == profile  # exact floats survive the round trip


@pytest.mark.parametrize("text,match", [
    ("stage,instruction,frequency,time\n0,forward,1740,0.1\n", "lacks columns"),
    ("stage,instruction,frequency,time,energy\n0,sideways,1740,0.1,3\n", "unknown instruction"),
    ("stage,instruction,frequency,time,energy\n0,forward,fast,0.1,3\n", "line 2"),
    ("stage,instruction,frequency,time,energy\n0,forward,1740,0.1,3\n", "no rows for"),
    ("stage,instruction,frequency,time,energy\n0,forward,1740,0.1,3\n0,backward,1740,0,3\n", "time > 0"),
])
def test_bad_csv_names_the_problem(tmp_path, text, match):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(ProfileError, match=match):
        PipelineProfile.read_csv(path, p2p_power_w=70.0)


def test_stage_gaps_and_negative_power_are_refused():
    rows = tuple(ProfileRow(s, i, 1740, 0.1, 3.0) for s in (0, 2) for i in Instruction)
    with pytest.raises(ProfileError, match="without gaps"):
        PipelineProfile(rows, 70.0)
    with pytest.raises(ProfileError, match="negative"):
        PipelineProfile(rows[:2], -1.0)


def test_downward_scan_stops_after_five_consecutive_rises():
    scan = DownwardScan()
    falling_then_rising = [10, 9, 8, 8.5, 9, 9.5, 10]  # four rises
    assert not scan.should_stop(falling_then_rising)
    assert scan.should_stop(falling_then_rising + [10.5])  # the fifth
    assert not scan.should_stop([10, 9, 9.5, 10, 9.9, 10.2, 10.4, 10.6])  # a dip resets the count
    assert DownwardScan(patience=1).should_stop([3, 4])
    with pytest.raises(ValueError, match="patience"):
        DownwardScan(patience=0)
