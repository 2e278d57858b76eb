// C++ names for crates/cli/tests/names.rs: a namespace, a class method,
// overloads and templates, each called a known number of times (volatile
// arguments: no call is folded away).
#include <cstdio>

namespace ns {
struct Class {
  int v = 0;
  __attribute__((noinline)) int method(int x) {
    v += x;
    return v;
  }
};
__attribute__((noinline)) int over(int x) { return x + 1; }
__attribute__((noinline)) int over(double x) { return (int)x + 2; }
__attribute__((noinline)) int over(const char *s, int n) { return s[0] + n; }
template <typename T> __attribute__((noinline)) T twice(T x) { return x + x; }
} // namespace ns

int main() {
  volatile int vi = 1;
  volatile double vd = 1.5;
  ns::Class c;
  int s = 0;
  for (int i = 0; i < 3; i++) s += c.method(vi);
  for (int i = 0; i < 5; i++) s += ns::over(vi);
  for (int i = 0; i < 7; i++) s += ns::over(vd);
  s += ns::over("a", vi);
  for (int i = 0; i < 2; i++) s += ns::twice<int>(vi);
  s += (int)ns::twice<long>(vi);
  printf("%d\n", s);
  return 0;
}
