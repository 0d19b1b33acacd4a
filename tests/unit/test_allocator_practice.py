"""Practice mode for the paged allocator (I085, I095, I015): the grader takes any class.

The reference passes; every defective variant (the naive copy-on-write drafts, the defect-hunt
variants) and every mutant of an independent, duck-typed solution fails with the broken property
named; an unimplemented skeleton is reported as such.
"""

import pytest

from lib.kvcache import BlockAllocator, DefectiveAllocator, NaiveCowAllocator, OutOfBlocks
from lib.kvcache import allocator_grading as ag
from lib.kvcache import allocator_practice as ap
from lib.kvcache import block_sharing as bs


class CleanRoom:
    """A solution written against the protocol only (no lib class), as a candidate would."""

    def __init__(self, num_blocks, block_size, *, mutant=""):
        self.num_blocks, self.block_size, self.mutant = num_blocks, block_size, mutant
        self.free_list = list(range(num_blocks))
        self.refs = [0] * num_blocks
        self.slots = [[None] * block_size for _ in range(num_blocks)]
        self.tables, self.lengths = {}, {}

    def _take(self, count):
        if count > len(self.free_list):
            if self.mutant == "partial_take":
                del self.free_list[: count - 1]
            raise OutOfBlocks(f"need {count}")
        taken, self.free_list = self.free_list[:count], self.free_list[count:]
        for b in taken:
            self.refs[b] = 1
        return taken

    def allocate(self, seq, tokens):
        if seq in self.tables:
            raise ValueError("exists")
        tokens = list(tokens)
        table = self._take(-(-len(tokens) // self.block_size))
        for i, t in enumerate(tokens):
            self.slots[table[i // self.block_size]][i % self.block_size] = t
        self.tables[seq], self.lengths[seq] = table, len(tokens)
        return list(table)

    def fork(self, parent, child):
        table = self.tables[parent]
        if self.mutant == "eager_copy":
            copy = self._take(len(table))
            for src, dst in zip(table, copy, strict=True):
                self.slots[dst][:] = self.slots[src]
            self.tables[child] = copy
        else:
            for b in table:
                self.refs[b] += 1
            self.tables[child] = list(table)
        self.lengths[child] = self.lengths[parent]

    def append_token(self, seq, token):
        table, n = self.tables[seq], self.lengths[seq]
        if n % self.block_size == 0:
            table += self._take(1)
        elif self.refs[table[-1]] > 1 or self.mutant == "copy_always":
            [dst] = self._take(1)
            self.slots[dst][:] = self.slots[table[-1]]
            self.refs[table[-1]] -= 1
            if self.refs[table[-1]] == 0:
                self.free_list.append(table[-1])
            table[-1] = dst
        self.slots[table[-1]][n % self.block_size] = token
        self.lengths[seq] = n + 1

    def free(self, seq):
        table = self.tables.pop(seq)
        del self.lengths[seq]
        for b in table:
            self.refs[b] -= 1
            if self.refs[b] == 0 and self.mutant != "never_free":
                self.free_list.append(b)

    def block_table(self, seq):
        return list(self.tables[seq])

    def refcount(self, block):
        return self.refs[block]

    def free_block_ids(self):
        return list(self.free_list)

    def read_block(self, block):
        return list(self.slots[block])


class Skeleton:
    def __init__(self, num_blocks, block_size):
        self.num_blocks, self.block_size = num_blocks, block_size

    def allocate(self, seq_id, tokens):
        raise NotImplementedError

    def fork(self, parent_id, child_id):
        raise NotImplementedError

    def append_token(self, seq_id, token):
        raise NotImplementedError

    def free(self, seq_id):
        raise NotImplementedError

    def block_table(self, seq_id):
        raise NotImplementedError

    def refcount(self, block):
        raise NotImplementedError

    def free_block_ids(self):
        raise NotImplementedError

    def read_block(self, block):
        raise NotImplementedError


def test_the_reference_and_an_independent_solution_pass():
    assert ap.check(BlockAllocator).passed
    report = ap.check(CleanRoom)
    assert report.passed, report
    assert report.cases_run == report.cases_total > 200


DEFECTIVE = {
    "write in place": (lambda n, b: NaiveCowAllocator(n, b, "write_in_place"), "copy_before_shared_write"),
    "forget decref": (lambda n, b: NaiveCowAllocator(n, b, "forget_decref"), "refcount_matches"),
    "leak on failure": (lambda n, b: DefectiveAllocator(n, b, leak_on_failed_allocation=True), "all_or_nothing"),
    "aliased copy": (lambda n, b: DefectiveAllocator(n, b, alias_copied_payload=True), "reads_what_it_wrote"),
    "both defects": (lambda n, b: DefectiveAllocator(n, b, leak_on_failed_allocation=True,
                                                    alias_copied_payload=True), None),
    "eager copy at fork": (lambda n, b: CleanRoom(n, b, mutant="eager_copy"), "blocks_as_predicted"),
    "copies a private block": (lambda n, b: CleanRoom(n, b, mutant="copy_always"), "sharing_as_predicted"),
    "never frees": (lambda n, b: CleanRoom(n, b, mutant="never_free"), "free_or_owned"),
    "takes blocks before failing": (lambda n, b: CleanRoom(n, b, mutant="partial_take"), "all_or_nothing"),
}


@pytest.mark.parametrize("name", DEFECTIVE)
def test_every_defective_variant_fails_shrunk(name):
    factory, broken = DEFECTIVE[name]
    report = ap.check(factory)
    assert report.status == "failed", report
    assert "shrunk to" in report.failure
    shrunk = int(report.failure.split("shrunk to ")[1].split(" ")[0])
    assert shrunk <= 5, report  # a few operations, not a random program
    if broken:
        assert f"broken: {broken}" in report.failure, report
    # the printed program is parse_op syntax: it replays
    ops = [ag.parse_op(line.split(". ", 1)[1]) for line in report.failure.splitlines()
           if line.strip()[:1].isdigit()]
    assert len(ops) == shrunk


def test_the_skeleton_is_reported_as_not_implemented():
    report = ap.check(Skeleton)
    assert report.status == "not implemented" and "NotImplementedError" in report.failure


def test_a_candidate_missing_a_method_is_told_which():
    class NoRead(CleanRoom):
        read_block = None

    report = ap.check(NoRead)
    assert report.status == "failed" and "lacks read_block" in report.failure


def test_check_rejects_a_non_callable():
    with pytest.raises(ValueError, match="check"):
        ap.check(BlockAllocator(4, 4))


def test_grader_and_oracles_take_any_protocol_class():
    report = ag.grade_allocator(lambda: CleanRoom(8, 4), num_programs=60, seed=3)
    assert report.passed, report.table()
    eager = ag.grade_allocator(lambda: CleanRoom(8, 4, mutant="partial_take"), num_programs=60, seed=3)
    assert "all_or_nothing" in eager.failing


def test_model_predicts_the_closed_form_counts():
    # independent: the step-by-step model against lib.kvcache.block_sharing's closed form
    for p in range(1, 20):
        for g in (0, 1, 5):
            for n in (1, 3):
                for b in (1, 4, 7):
                    c = bs.parallel_sampling_blocks(p, g, n, b)
                    assert ap.simulate_parallel_sampling(p, g, n, b) == (
                        c.blocks_shared, c.blocks_unshared, c.copies), (p, g, n, b)


def test_sharing_count_grader():
    def closed_form(p, g, n, b):
        c = bs.parallel_sampling_blocks(p, g, n, b)
        return c.blocks_shared, c.blocks_unshared, c.copies

    assert ap.check_sharing_counts(closed_form).passed
    always_copies = ap.check_sharing_counts(
        lambda p, g, n, b: (p // b + n * -(-(p % b + g) // b), n * -(-(p + g) // b), n - 1))
    assert always_copies.status == "failed" and "P=4, G=1" in always_copies.failure
    ignores_g0 = ap.check_sharing_counts(
        lambda p, g, n, b: (p // b + n * -(-(p % b + g) // b), n * -(-(p + g) // b), (n - 1) * (p % b > 0)))
    assert ignores_g0.status == "failed"


def test_replays_take_any_protocol_class():
    ref = bs.replay_parallel_sampling(10, 5, 4, 4)
    assert bs.replay_parallel_sampling(10, 5, 4, 4, allocator_factory=CleanRoom) == ref
    parents = bs.beam_search_parents(4, 12, 0)
    assert bs.replay_beam_search(10, parents, 4, allocator_factory=CleanRoom) == bs.replay_beam_search(10, parents, 4)


# --------------------------------------------------------------------------- the defect hunt, blind
def test_hunt_names_are_neutral_and_the_variants_behave():
    from lib.kvcache import content_oracle, ownership_oracle

    assert ap.HUNT_NAMES == ("staging", "variant A", "variant B", "fixed")
    assert all("leak" not in n and "alias" not in n for n in ap.HUNT_NAMES)
    assert ap.check(lambda n, b: ap.hunt_allocator("fixed", n, b)).passed
    for name in ("staging", "variant A", "variant B"):
        assert not ap.check(lambda n, b, name=name: ap.hunt_allocator(name, n, b)).passed
    # exhaustive search: the capacity defect needs one op (an allocation larger than the pool),
    # the sibling-token defect four; the fixed allocator has none within four
    leak = ap.shortest_failure(lambda: ap.hunt_allocator("variant A", 4, 4), ownership_oracle)
    assert leak == ["allocate(seq=0, tokens=[" + ", ".join(map(str, range(17))) + "])"]
    alias = ap.shortest_failure(lambda: ap.hunt_allocator("variant B", 4, 4), content_oracle, max_ops=4)
    assert [ag.parse_op(t).kind for t in alias] == ["allocate", "fork", "append", "append"]
    assert ap.shortest_failure(lambda: ap.hunt_allocator("fixed", 4, 4), content_oracle, max_ops=3) is None
    assert "leak" in ap.hunt_reveal("variant A") and "payload" in ap.hunt_reveal("variant B")


def test_check_reproducers():
    assert not ap.check_reproducers().passed
    good = ap.check_reproducers("allocate(seq=0, tokens=[0, 1, 2, 3, 4]); allocate(seq=1, tokens=[0, 1, 2, 3, 4, 5, 6, 7, 8])",
                                "allocate(seq=0, tokens=[0]); fork(parent=0, child=1); append(seq=0, token=0); "
                                "append(seq=1, token=1)")
    assert good.passed and "a shorter program exists: 1" in repr(good)
    bad = ap.check_reproducers("allocate(seq=0, tokens=[0]); free(seq=0)", "append(seq=3, token=1)")
    assert not bad.passed and "shows no capacity symptom" in repr(bad) and "does not run" in repr(bad)
    trailing = ap.check_reproducers("allocate(seq=0, tokens=[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]); "
                                    "allocate(seq=1, tokens=[0])")
    assert "not needed" in repr(trailing)


def test_allocator_explorer_runs_a_typed_program_and_reports_partial():
    from lib.book import widgets
    from lib.explorers import kvcache_alloc as ka

    rows, _ = ka.run_typed_program(BlockAllocator(3, 2), "allocate(seq=0, tokens=[0, 1, 2]); append(seq=0, token=3); "
                                   "append(seq=0, token=4); append(seq=0, token=5); append(seq=0, token=6)")
    outcome = dict(rows)
    assert outcome["5. append(seq=0, token=6)"] == "OutOfBlocks: this op changed nothing"
    assert outcome["program"] == "partial: 4 of 5 ops took effect"
    leaky, _ = ka.run_typed_program(DefectiveAllocator(4, 4, leak_on_failed_allocation=True),
                                    "allocate(seq=0, tokens=[0, 1, 2, 3, 4]); allocate(seq=1, tokens=[" +
                                    ", ".join(map(str, range(12))) + "])")
    assert "not all or nothing" in dict(leaky)["2. allocate(seq=1, tokens=[" + ", ".join(map(str, range(12))) + "])"]
    with pytest.raises(ValueError, match="op must look like"):
        ka.parse_program("resize(seq=0)")
    for program in ka.PROGRAMS[1:]:
        view = widgets.render("kvcache.block_allocator_ops", allocator="BlockAllocator (correct)", num_blocks=4,
                              block_size=2, prompt_tokens=3, op1="-", op2="-", op3="-", op4="-", op5="-", op6="-",
                              program=program)
        assert dict(view.rows)["program"].startswith(("all applied", "partial"))
