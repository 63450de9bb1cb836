"""The smallest complete adapter: a ring of spec.capacity rows per state
that reports the slots it writes and reads; kvcheck computes the outputs."""
import kvcheck


class ToyRing(kvcheck.Engine):
    outputs = False      # a block manager without a kernel: kvcheck attends over the slots read
    addressing = "ring"

    def decode(self, step):
        def slot(p): return kvcheck.ring_slot(self.spec, step.state, p)
        return kvcheck.answer(written=[slot(p) for p in step.positions],
                              read=[[slot(j) for j in kvcheck.window(self.spec, p)] for p in step.positions])

    prefill = decode     # store_then_load: store the chunk, then every query reads


if __name__ == "__main__":
    kvcheck.serve(ToyRing)
