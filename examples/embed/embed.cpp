// A host application embedding the installed kiln: built with `pkg-config --cflags --libs kiln`.
#include <kiln/kiln.hpp>

#include <cstdio>

int main() {
    kiln::Context ctx;
    kiln::Tensor a = ctx.array(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
    kiln::Tensor out = ctx.empty({2, 1});
    out[kiln::all] = kiln::sum(a * a, 1);  // rows: 1+4+9, 16+25+36
    auto v = out.to_vector<float>();
    bool ok = v[0] == 14.0f && v[1] == 77.0f;
    std::printf("embedded kiln: row sums of squares = %g %g (%s)\n", v[0], v[1], ok ? "ok" : "WRONG");
    return ok ? 0 : 1;
}
