"""The trajectory JSONL format: round trip and errors naming the line."""
import pytest

from dualpath.traces import Trajectory, TraceFormatError, read_trajectories, write_trajectories
from dualpath.traces.format import parse_line

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
    ('{"id": "x"}', "missing required field `turns`"),
    ('{"id": "x", "turns": []}', "length >= 1 - at `$.turns`"),
    ('{"id": "x", "turns": [[1]]}', "length 2, got 1 - at `$.turns[0]`"),
    ('{"id": "x", "turns": [[5, 1], [3, 0]]}', "`int` >= 1 - at `$.turns[1][1]`"),
    ('{"id": "x", "turns": [[5, 1], [-1, 2]]}', "`int` >= 0 - at `$.turns[1][0]`"),
    ('{"id": "x", "turns": [[5, true]]}', "got `bool` - at `$.turns[0][1]`"),
    ('{"id": "x", "turns": [[5, 1.5]]}', "got `float` - at `$.turns[0][1]`"),
    ('{"id": ["x"], "turns": [[5, 1]]}', "at `$.id`"),
    ('{"id": "x", "turns": [[0, 1]]}', "turn 0: the first append must be >= 1"),
    ('[1, 2]', "Expected `object`, got `array`"),
])
def test_errors_name_the_bad_line(tmp_path, line, reason):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "ok", "turns": [[1, 1]]}\n\n' + line + "\n")
    with pytest.raises(TraceFormatError) as exc:
        read_trajectories(path)
    assert exc.value.line == 3
    assert "bad.jsonl:3: " in str(exc.value) and reason in str(exc.value)


def test_other_keys_are_kept_as_meta_and_a_missing_id_names_the_line():
    t = parse_line('{"turns": [[3, 1]], "max_len": 4096, "source": "x"}', line=7)
    assert t.id == "line7" and t.meta == {"max_len": 4096, "source": "x"}
    assert parse_line('{"id": 12, "turns": [[3, 1]]}').id == "12"


def test_empty_file_is_an_error(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    with pytest.raises(TraceFormatError):
        read_trajectories(path)
