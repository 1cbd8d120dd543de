"""The trajectory JSONL format: round trip and errors naming the line."""
import pytest

from dualpath.traces import Trajectory, TraceFormatError, read_trajectories, write_trajectories

pytestmark = pytest.mark.unit


def test_round_trip_and_prompts(tmp_path):
    t = Trajectory("a", ((100, 10), (20, 5), (0, 3)))
    path = tmp_path / "t.jsonl"
    assert write_trajectories(path, [t, Trajectory("b", ((1, 1),))]) == 2
    back = read_trajectories(path)
    assert back[0] == t and back[1].id == "b"
    assert t.prompts() == [100, 130, 135]  # turn i+1 sees A1,G1,...,Ai,Gi then its append
    assert t.total_tokens == 138


@pytest.mark.parametrize("line, reason", [
    ("{not json", "not JSON"),
    ('{"id": "x", "turns": []}', "non-empty"),
    ('{"id": "x", "turns": [[1]]}', "turn 0"),
    ('{"id": "x", "turns": [[5, 1], [3, 0]]}', "turn 1: need append >= 0 and gen >= 1"),
    ('{"id": "x", "turns": [[0, 1]]}', "first append"),
    ('[1, 2]', "expected an object"),
])
def test_errors_name_the_bad_line(tmp_path, line, reason):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "ok", "turns": [[1, 1]]}\n\n' + line + "\n")
    with pytest.raises(TraceFormatError) as exc:
        read_trajectories(path)
    assert exc.value.line == 3
    assert f"bad.jsonl:3: " in str(exc.value) and reason in str(exc.value)


def test_empty_file_is_an_error(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    with pytest.raises(TraceFormatError):
        read_trajectories(path)
