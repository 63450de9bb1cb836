// Attention, RoPE and head layouts of the reference model.
#include <catch2/catch.hpp>

#include "model/attention.hpp"

using namespace kvcheck::model;

TEST_CASE("Attention: softmax subtracts the peak so huge scores do not overflow") {
  const Row<Real> q{Real(1e6)};
  const std::vector<Row<Real>> keys{{Real(1)}, {Real(1)}};
  const std::vector<Row<Real>> values{{Real(2)}, {Real(4)}};
  const Row<double> qd{1e6};
  const std::vector<Row<double>> kd{{1}, {1}}, vd{{2}, {4}};
  CHECK(to_double(attend(q, keys, values, Real(1))[0]) == Approx(3.0));
  CHECK(attend(qd, kd, vd, 1.0)[0] == Approx(3.0));  // double would overflow without the shift
}

TEST_CASE("Attention: a sink logit takes weight from every row without adding a value") {
  const Row<Real> q{Real(0)};
  const std::vector<Row<Real>> keys{{Real(1)}};
  const std::vector<Row<Real>> values{{Real(6)}};
  // One row with score 0 and a sink with logit 0: the row gets weight 1/2.
  CHECK(to_double(attend(q, keys, values, Real(1), Real(0))[0]) == Approx(3.0).epsilon(1e-30));
}

TEST_CASE("RoPE: rotation keeps the norm, neox and interleaved differ by a permutation") {
  Row<Real> a{Real(1), Real(2), Real(3), Real(4)};
  Row<Real> b{Real(1), Real(3), Real(2), Real(4)};  // interleaved order of neox pairs (0,2),(1,3)
  rope_rotate(a, 7, Rope{RopeStyle::kNeox, 4, 10000.0});
  rope_rotate(b, 7, Rope{RopeStyle::kInterleaved, 4, 10000.0});
  CHECK(to_double(a[0]) == Approx(to_double(b[0])).epsilon(1e-30));
  CHECK(to_double(a[2]) == Approx(to_double(b[1])).epsilon(1e-30));
  CHECK(to_double(a[1]) == Approx(to_double(b[2])).epsilon(1e-30));
  const Real norm = a[0] * a[0] + a[1] * a[1] + a[2] * a[2] + a[3] * a[3];
  CHECK(to_double(Real(abs(norm - 30))) < 1e-30);
}

TEST_CASE("RoPE: partial rotary width leaves the tail untouched and relative angle is preserved") {
  Row<Real> q{Real(1), Real(0), Real(5), Real(6)};
  rope_rotate(q, 3, Rope{RopeStyle::kInterleaved, 2, 10000.0});
  CHECK(q[2] == Real(5));
  CHECK(q[3] == Real(6));
  CHECK(to_double(q[0]) == Approx(std::cos(3.0)));
  // q(m) . k(n) depends on m - n only.
  auto dot_at = [](std::int64_t m, std::int64_t n) {
    Row<Real> x{Real(1), Real(2)}, y{Real(3), Real(-1)};
    rope_rotate(x, m, Rope{RopeStyle::kNeox, 2, 10000.0});
    rope_rotate(y, n, Rope{RopeStyle::kNeox, 2, 10000.0});
    return x[0] * y[0] + x[1] * y[1];
  };
  CHECK(to_double(Real(abs(dot_at(10, 4) - dot_at(1006, 1000)))) < 1e-28);
}

TEST_CASE("Heads: GQA query heads read their group's KV head, shared rows are key and value") {
  Projected<Real> r0, r1;
  r0.k = {Real(1), Real(0), Real(0), Real(1)};  // kv head 0: (1,0), kv head 1: (0,1)
  r0.v = {Real(10), Real(0), Real(0), Real(20)};
  r1.k = {Real(0), Real(1), Real(1), Real(0)};
  r1.v = {Real(0), Real(30), Real(40), Real(0)};
  // 4 query heads, 2 kv heads: heads 0,1 -> kv 0; heads 2,3 -> kv 1.
  Row<Real> q(8, Real(0));
  const Row<Real> out = attend_heads(q, {&r0, &r1}, Heads{4, 2, 2, false}, Real(1));
  CHECK(to_double(out[0]) == Approx(5.0));  // head 0 mixes kv0 values equally
  // Head 2 mixes kv head 1's values (0,20) and (40,0) equally: (20, 10).
  CHECK(to_double(out[4]) == Approx(20.0));
  CHECK(to_double(out[5]) == Approx(10.0));
  Projected<Real> s0;
  s0.k = {Real(2), Real(3)};
  const Row<Real> shared =
      attend_heads(Row<Real>{Real(0), Real(0), Real(0), Real(0)}, {&s0}, Heads{2, 1, 2, true}, Real(1));
  CHECK(shared == Row<Real>{Real(2), Real(3), Real(2), Real(3)});
}
