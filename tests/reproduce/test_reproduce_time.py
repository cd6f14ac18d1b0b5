"bench/reproduce_time.py's replay of a finished run's experiment seconds under another order (issue 47: the run's time)."
import json

from conftest import bench_module

def _bench(): return bench_module('reproduce_time')

def test_replay_takes_the_order_as_slots_free_up():
    replay = _bench().replay
    s = {'a': 1., 'b': 1., 'c': 4.}
    # by hand: a and b start at 10, end at 11; c takes the first free slot at 11, ends at 15
    assert replay(s, ['a', 'b', 'c'], slots=2, start=10.) == (15., 11.)
    # longest first: c starts at 0 beside a; b follows a at 1: all done at 4
    assert replay(s, ['c', 'a', 'b'], slots=2) == (4., 1.)
    assert replay(s, ['a', 'b', 'c'], slots=1) == (6., 1.)   # one slot: the work, whatever the order

def test_schedule_reads_a_runs_seconds(tmp_path, capsys):
    for n, sec in {'00_x': 5., '10_y': 30., '20_z': 20., '30_w': 25.}.items():
        (tmp_path/'tiny'/n).mkdir(parents=True); (tmp_path/'tiny'/n/'inputs.json').write_text(json.dumps({'seconds': sec}))
    _bench().schedule(tmp_path, 'tiny', 2, 0.)
    out = capsys.readouterr().out
    # notebook order: 00 | 10; 20 after 00 (5 → 25); 30 after 25 → 50. Quickest then longest: 00 | 10; 30 at 5 → 30; 20 at 30 → 50
    assert '| notebook order (the runner) | 50 | 5 |' in out and '| 00_x first, then longest first | 50 | 5 |' in out
    assert '| lower bound (work / slots) | 40 | |' in out
