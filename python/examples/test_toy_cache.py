import kvcheck


class ToyRing(kvcheck.Engine):
    outputs = False  # kvcheck attends over the slots read
    addressing = "ring"

    def decode(self, step):
        def slot(p): return kvcheck.ring_slot(self.spec, step.state, p)
        return kvcheck.answer(written=[slot(p) for p in step.positions],
                              read=[[slot(j) for j in kvcheck.window(self.spec, p)] for p in step.positions])
    prefill = decode


def test_toy_ring(check_engine):
    check_engine(ToyRing, cases=100)
