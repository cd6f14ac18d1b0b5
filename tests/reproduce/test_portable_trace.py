"bench/portable_trace.py: two traces of operation hashes, walked to the first operation whose output differs."
import json

from conftest import bench_module

def _write(path, rows): path.write_text(''.join(json.dumps(r) + '\n' for r in rows)); return path

def test_diff_names_the_first_differing_operation_and_only_lists_what_one_trace_alone_runs(tmp_path, capsys):
    pt = bench_module('portable_trace')
    a = [[0, 'aten.mm.default', [[2, 2], [2, 2]], ['aa']], [1, 'aten.sqrt.default', [[2, 2]], ['bb']], [2, 'aten.add.Tensor', [[2, 2], [2, 2]], ['cc']]]
    b = [a[0], [1, 'aten.sqrt.default', [[2, 2]], ['xx']], [2, 'aten.add.Tensor', [[2, 2], [2, 2]], ['yy']]]
    A, B, A2 = _write(tmp_path/'a.jsonl', a), _write(tmp_path/'b.jsonl', b), _write(tmp_path/'a2.jsonl', a)
    assert pt.diff(A, A2) == 0 and 'all 3 operations give the same bytes' in capsys.readouterr().out
    assert pt.diff(A, B) == 1
    out = capsys.readouterr().out
    assert 'first differing output at operation 1 of 3' in out and '> 1 aten.sqrt.default' in out and '2 of 2' in out
    c = [a[0], [1, 'aten.exp.default', [[2, 2]], ['bb']]]   # another operation at the same place: the sequences part
    assert pt.diff(A, _write(tmp_path/'c.jsonl', c)) == 1 and 'part at operation 1' in capsys.readouterr().out
    pt.only(A, _write(tmp_path/'d.jsonl', a[:1]))
    out = capsys.readouterr().out
    assert 'aten.sqrt.default' in out and 'aten.add.Tensor' in out and 'aten.mm.default' not in out

def test_compare_lists_the_kernels_each_probe_computes_otherwise_than_the_first(tmp_path, capsys):
    pt = bench_module('portable_trace')
    def probe(name, qemu, sets, hashes):
        (tmp_path/name).write_text(json.dumps({'set': sets, 'qemu': qemu, 'hashes': hashes})); return tmp_path/name
    p0 = probe('0.json', None, [], {'mm': 'a', 'exp': 'b', 'sqrt': 'c'})
    p1 = probe('1.json', 'Skylake-Client', [], {'mm': 'a', 'exp': 'b', 'sqrt': 'c'})
    p2 = probe('2.json', 'Skylake-Client', ['MKL_CBWR=AVX2'], {'mm': 'x', 'exp': 'b', 'sqrt': 'y'})
    assert pt.compare([p0, p1, p2]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == 'against this CPU (portable):'
    assert 'Skylake-Client (portable)' in lines[1] and ' 0 of 3 differ' in lines[1]
    assert 'Skylake-Client MKL_CBWR=AVX2' in lines[2] and '2 of 3 differ: mm, sqrt' in lines[2]
