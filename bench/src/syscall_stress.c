// A program whose every system call result is logged, for comparing a
// traced run with an untraced one (bench/transparency.sh). Each iteration
// mixes what a burst signal could disturb: big reads and writes, pipes to a
// slow reader, getrandom, poll and epoll with timeouts, a timerfd, a signal
// handler, nanosleep, work with every signal blocked and then a drain with
// sigtimedwait (which must find nothing queued), and every
// 25th iteration a fork. Results are deterministic whatever the speed:
// timeouts that must expire, events that are ready, counts not times.
//
//   syscall_stress ITERATIONS LOG
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static FILE *logf;
static unsigned long iter;
static volatile sig_atomic_t usr1;
static volatile unsigned long sink;

static void say(const char *what, long r) {
    fprintf(logf, "%lu %s %ld %s\n", iter, what, r, r < 0 ? strerror(errno) : "");
}

static void on_usr1(int sig) {
    (void)sig;
    usr1++;
}

__attribute__((noinline)) static unsigned long mix(unsigned long h, unsigned long i) {
    h ^= i;
    h *= 1099511628211UL;
    return (h & 1) ? h + (i >> 3) : h ^ (h >> 7);
}

__attribute__((noinline)) static void work(unsigned long n) {
    unsigned long h = 1469598103934665603UL;
    for (unsigned long i = 0; i < n; i++)
        h = mix(h, i);
    sink = h;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s ITERATIONS LOG\n", argv[0]);
        return 2;
    }
    unsigned long n = strtoul(argv[1], NULL, 10);
    logf = fopen(argv[2], "w");
    if (!logf) {
        perror(argv[2]);
        return 2;
    }
    const size_t big = 4 << 20;
    char *buf = malloc(big);
    int zero = open("/dev/zero", O_RDONLY);
    int p[2], quiet[2];
    if (!buf || zero < 0 || pipe(p) || pipe(quiet)) {
        perror("setup");
        return 2;
    }
    fcntl(p[0], F_SETPIPE_SZ, 1 << 16);
    pid_t reader = fork();
    if (reader == 0) {
        close(p[1]);
        static char rb[8192];
        long total = 0;
        ssize_t r;
        while ((r = read(p[0], rb, sizeof rb)) != 0)
            if (r > 0)
                total += r;
            else if (errno != EINTR)
                _exit(3);
        _exit(total == (long)n * (256 << 10) ? 0 : 4);
    }
    close(p[0]);
    struct sigaction sa = {.sa_handler = on_usr1};
    sigaction(SIGUSR1, &sa, NULL);
    int ep = epoll_create1(0), ev = eventfd(1, 0), ep_empty = epoll_create1(0);
    struct epoll_event e = {.events = EPOLLIN, .data.fd = ev};
    epoll_ctl(ep, EPOLL_CTL_ADD, ev, &e);
    int tfd = timerfd_create(CLOCK_MONOTONIC, 0);
    sigset_t all;
    sigfillset(&all);
    for (iter = 0; iter < n; iter++) {
        work(200000);
        say("read", read(zero, buf, big));
        memset(buf, (int)iter, 256 << 10);
        say("write", write(p[1], buf, 256 << 10));
        say("getrandom", getrandom(buf, 1 << 20, 0));
        struct pollfd pf = {.fd = quiet[0], .events = POLLIN};
        say("poll", poll(&pf, 1, 1));
        struct epoll_event out;
        say("epoll_wait", epoll_wait(ep, &out, 1, 10));
        say("epoll_wait_empty", epoll_wait(ep_empty, &out, 1, 1));
        struct itimerspec its = {.it_value = {0, 200000}};
        timerfd_settime(tfd, 0, &its, NULL);
        unsigned long long exp;
        say("timerfd_read", read(tfd, &exp, sizeof exp));
        say("kill", kill(getpid(), SIGUSR1));
        struct timespec ns = {0, 100000};
        say("nanosleep", nanosleep(&ns, NULL));
        // Every signal blocked while working: none may be queued meanwhile.
        sigset_t old;
        sigprocmask(SIG_BLOCK, &all, &old);
        work(200000);
        struct timespec z = {0, 0};
        say("sigtimedwait", sigtimedwait(&all, NULL, &z));
        sigprocmask(SIG_SETMASK, &old, NULL);
        if (iter % 25 == 0) {
            pid_t c = fork();
            if (c == 0) {
                work(100000);
                _exit((int)(iter % 7));
            }
            int st = 0;
            say("waitpid", waitpid(c, &st, 0) == c ? st : -1);
        }
    }
    close(p[1]);
    int st = 0;
    waitpid(reader, &st, 0);
    iter = n;
    say("reader_status", st);
    say("usr1_handled", usr1);
    fclose(logf);
    printf("%lu iterations\n", n);
    return 0;
}
