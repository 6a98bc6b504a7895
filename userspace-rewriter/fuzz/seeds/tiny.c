/* A libc-less x86-64 program for the fuzz seed corpus: small (a few KB) but
 * with branches, loops, a jump table, recursion, a tail call and a noreturn
 * exit, so that mutations reach every stage of the analysis. */
volatile int sink;

__attribute__((noinline)) int branchy(int x)
{
    if (x & 1) sink = 1;
    if (x & 2) sink = 2;
    return x;
}

__attribute__((noinline)) int looped(int n)
{
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++)
            sink += (i & 1) ? j : -j;
    return sink;
}

__attribute__((noinline)) int switched(unsigned x)
{
    switch (x) {
    case 0: sink = 10; break;
    case 1: sink += 3; break;
    case 2: sink -= 7; break;
    case 3: sink *= 5; break;
    case 4: sink ^= 0x55; break;
    case 5: sink <<= 2; break;
    case 6: sink /= 3; break;
    default: break;
    }
    return sink;
}

__attribute__((noinline)) long rec(int n)
{
    return n < 2 ? n : rec(n - 1) + rec(n - 2);
}

__attribute__((noinline)) int leaf(int a) { return a + sink; }
__attribute__((noinline)) int tail(int a) { return leaf(a * 3); }

__attribute__((noinline, noreturn)) void bye(int code)
{
    __asm__ volatile("syscall" : : "a"(60), "D"(code));
    __builtin_unreachable();
}

void _start(void)
{
    int r = branchy(sink) + looped(sink) + switched(sink) + (int)rec(sink) + tail(sink);
    bye(r & 0x7f);
}
