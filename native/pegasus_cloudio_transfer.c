/* pegasus-cloudio-transfer: the native front end of the pegasus-transfer drop-in.
 *
 * Contract (the same as pegasus_cloudio/dropin/launch.py with pegasus_cloudio/stager/client.py,
 * which it replaces on the hot path of every job step, so no Python starts in the client):
 *
 * - PEGASUS_CLOUDIO_STAGER set in the environment (ASCII whitespace around it stripped,
 *   non-empty): connect to that Unix socket; use it only if SO_PEERCRED says the stager runs as
 *   this user; send one request of pegasus_cloudio/stager/wire.py v1 (the 4-byte big-endian
 *   length and wire.DESCRIPTORS descriptors as SCM_RIGHTS in one sendmsg: stdin, stdout,
 *   stderr and the working directory, open(".", O_PATH | O_DIRECTORY), where the job runs;
 *   then the NUL-separated fields: v1, cwd (for messages), umask, argc, arguments, NAME=value
 *   for each environment variable as Python's os.environ holds them); read "P" + pid, then
 *   "X" + exit code, and exit with that code. SIGTERM, SIGINT and SIGHUP received meanwhile
 *   are passed on to that pid.
 * - When the stager cannot take the job (unreachable, another uid, a refusal "R", closed
 *   early, a request over wire.MAX_REQUEST): one line on stderr, the same as client.py's, then
 *   run the job in-process as below, with _PEGASUS_CLOUDIO_STAGER_TRIED=1 so the Python side
 *   does not try (and warn) again.
 * - Otherwise (and after such a fallback): execv the Python drop-in, PY_NAME in the directory
 *   of this program's real path (/proc/self/exe, else argv[0]'s; so a pegasus-transfer symlink
 *   to it works), with the same arguments and _PEGASUS_CLOUDIO_NATIVE=<that real path>, which
 *   launch.py makes its sys.argv[0] (the stock-tool finder skips this program by it).
 *   launch.py removes both variables before the job runs. A stager named only in the config
 *   file is found there.
 *
 * C99 and POSIX with Linux's SO_PEERCRED; no allocation is unbounded: the request is sized
 * first and refused over MAX_REQUEST; reads are of fixed sizes; EINTR is retried.
 */
#define _GNU_SOURCE /* struct ucred */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <unistd.h>

#ifndef MAX_REQUEST
#define MAX_REQUEST (16 * 1024 * 1024) /* wire.MAX_REQUEST; a test build lowers it */
#endif
#define ENV_VAR "PEGASUS_CLOUDIO_STAGER"
#define TRIED_VAR "_PEGASUS_CLOUDIO_STAGER_TRIED"
#define NATIVE_VAR "_PEGASUS_CLOUDIO_NATIVE"
#define PY_NAME "pegasus-cloudio-transfer-py"
#define MAX_REASON 1024 /* wire.MAX_REASON */
#define REPLY_BYTES 5

extern char **environ;

static volatile sig_atomic_t job_pid, forwarded;

static void forward(int signum)
{
    int saved = errno;
    forwarded = 1;
    kill((pid_t)job_pid, signum); /* ESRCH: the job has ended; nothing to do */
    errno = saved;
}

static void warn_line(const char *path, const char *what, const char *detail)
{
    fprintf(stderr, "pegasus-transfer: node stager %s %s%s; transferring in this process\n", path, what, detail);
}

/* Python's bytes.decode("utf-8", "replace") written out: each maximal invalid subpart of a
 * sequence (a bad lead byte, or a lead byte and the valid continuations that follow it) becomes
 * one U+FFFD. */
static void put_utf8_replaced(const unsigned char *s, size_t n)
{
    for (size_t i = 0, got; i < n; i += got + 1) {
        unsigned char c = s[i], lo = c == 0xe0 ? 0xa0 : c == 0xf0 ? 0x90 : 0x80;
        unsigned char hi = c == 0xed ? 0x9f : c == 0xf4 ? 0x8f : 0xbf;
        size_t need = c < 0x80 ? 0 : c < 0xc2 ? 9 : c < 0xe0 ? 1 : c < 0xf0 ? 2 : c < 0xf5 ? 3 : 9;
        for (got = 0; need != 9 && got < need && i + 1 + got < n; got++) {
            unsigned char d = s[i + 1 + got];
            if (d < (got == 0 ? lo : 0x80) || d > (got == 0 ? hi : 0xbf))
                break;
        }
        if (got == need)
            fwrite(s + i, 1, need + 1, stderr);
        else
            fputs("\xef\xbf\xbd", stderr);
    }
}

static int is_space(char c) /* str.isspace for ASCII and the separators \x1c-\x1f */
{
    return c == ' ' || (c >= '\t' && c <= '\r') || (c >= '\x1c' && c <= '\x1f');
}

/* Every byte of buf, retrying short writes and EINTR; 0, or -1 with errno. */
static int send_all(int fd, const char *buf, size_t n)
{
    while (n > 0) {
        ssize_t sent = send(fd, buf, n, MSG_NOSIGNAL);
        if (sent < 0 && errno == EINTR)
            continue;
        if (sent < 0)
            return -1;
        buf += sent;
        n -= (size_t)sent;
    }
    return 0;
}

/* Up to n bytes into buf until EOF; the count read, or -1 with errno. */
static ssize_t recv_upto(int fd, unsigned char *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = recv(fd, buf + got, n - got, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -1;
        if (r == 0)
            break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

/* The next 5-byte reply: 1 (kind, value set), 0 when the connection closed first, -1 (errno). */
static int read_reply(int fd, char *kind, int32_t *value)
{
    unsigned char buf[REPLY_BYTES];
    ssize_t got = recv_upto(fd, buf, sizeof buf);
    if (got < 0)
        return -1;
    if (got < REPLY_BYTES)
        return 0;
    *kind = (char)buf[0];
    *value = (int32_t)(((uint32_t)buf[1] << 24) | ((uint32_t)buf[2] << 16) | ((uint32_t)buf[3] << 8) | buf[4]);
    return 1;
}

static size_t name_len(const char *entry)
{
    return strcspn(entry, "=");
}

static int by_name_then_place(const void *a, const void *b)
{
    size_t i = *(const size_t *)a, j = *(const size_t *)b, ni = name_len(environ[i]), nj = name_len(environ[j]);
    int c = memcmp(environ[i], environ[j], ni < nj ? ni : nj);
    if (c == 0)
        c = ni != nj ? (ni < nj ? -1 : 1) : (i < j ? -1 : 1);
    return c;
}

/* keep[i] != 0 when environ[i] is in Python's os.environ: it has a '=' and no earlier entry
 * has its name (CPython keeps the first of duplicates). O(n log n); NULL when out of memory. */
static char *kept_entries(void)
{
    size_t n = 0, last = (size_t)-1, *order;
    char *keep;
    while (environ[n])
        n++;
    order = malloc((n + 1) * sizeof *order);
    keep = malloc(n + 1);
    if (!order || !keep) {
        free(order);
        free(keep);
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        order[i] = i, keep[i] = strchr(environ[i], '=') != NULL;
    qsort(order, n, sizeof *order, by_name_then_place);
    for (size_t k = 0; k < n; k++) {
        size_t i = order[k];
        if (!keep[i])
            continue;
        if (last != (size_t)-1 && name_len(environ[last]) == name_len(environ[i])
            && memcmp(environ[last], environ[i], name_len(environ[i])) == 0)
            keep[i] = 0;
        else
            last = i;
    }
    free(order);
    return keep;
}

/* Append a field (and its NUL separator unless first) to out at *at, or only count it. */
static void field(char *out, size_t *at, const char *s, size_t n)
{
    if (*at > 0) {
        if (out)
            out[*at] = '\0';
        (*at)++;
    }
    if (out)
        memcpy(out + *at, s, n);
    *at += n;
}

/* The wire.encode_request bytes into out (NULL: only sized); returns the size. */
static size_t encode(char *out, const char *cwd, mode_t umask_now, int argc, char **argv, const char *keep)
{
    char num[32];
    size_t at = 0;
    field(out, &at, "v1", 2);
    field(out, &at, cwd, strlen(cwd));
    field(out, &at, num, (size_t)snprintf(num, sizeof num, "%u", (unsigned)umask_now));
    field(out, &at, num, (size_t)snprintf(num, sizeof num, "%d", argc > 0 ? argc - 1 : 0));
    for (int i = 1; i < argc; i++)
        field(out, &at, argv[i], strlen(argv[i]));
    for (size_t i = 0; environ[i]; i++)
        if (keep[i])
            field(out, &at, environ[i], strlen(environ[i]));
    return at;
}

static char *current_dir(void)
{
    for (size_t size = 4096; size <= (1u << 20); size *= 2) {
        char *buf = malloc(size);
        if (!buf || getcwd(buf, size))
            return buf;
        free(buf);
        if (errno != ERANGE)
            return NULL;
    }
    errno = ENAMETOOLONG;
    return NULL;
}

/* Connect to the stager at path as this user's; the socket, or -1 after one warning. */
static int connect_stager(const char *path)
{
    struct sockaddr_un addr;
    struct ucred cred;
    socklen_t len = sizeof cred;
    size_t n = strlen(path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    if (n > sizeof addr.sun_path) { /* Python's OSError has no strerror: its text */
        warn_line(path, "(" ENV_VAR ") not reachable (AF_UNIX path too long)", "");
        if (fd >= 0)
            close(fd);
        return -1;
    }
    memcpy(addr.sun_path, path, n);
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n)) < 0
        || getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
        char why[256];
        snprintf(why, sizeof why, "%s)", strerror(errno));
        warn_line(path, "(" ENV_VAR ") not reachable (", why);
        if (fd >= 0)
            close(fd);
        return -1;
    }
    if (cred.uid != getuid()) {
        char why[64];
        snprintf(why, sizeof why, "%u, not as this user", (unsigned)cred.uid);
        warn_line(path, "runs as uid ", why);
        close(fd);
        return -1;
    }
    return fd;
}

/* The request's bytes in a new buffer (*size set), NULL with errno; *size over MAX_REQUEST and
 * NULL with errno 0 when too large (nothing is allocated for it). */
static char *build_request(size_t *size, int argc, char **argv)
{
    mode_t mask = umask(022);
    char *cwd = current_dir(), *keep = kept_entries(), *request = NULL;
    umask(mask);
    if (cwd && keep) {
        *size = encode(NULL, cwd, mask, argc, argv, keep);
        errno = 0;
        if (*size <= MAX_REQUEST && (request = malloc(*size + 1)) != NULL)
            encode(request, cwd, mask, argc, argv, keep);
    } else if (!keep) {
        errno = ENOMEM;
    }
    free(cwd);
    free(keep);
    return request;
}

/* fd moved to 3 or above (the low one closed), or -1 with errno. Open in place of a closed stdin,
 * stdout or stderr, it would go out as that stream too; above them, the closed stream fails the
 * send with EBADF and the job runs in this process, as it did before the directory was sent. */
static int above_streams(int fd)
{
    int moved, saved;
    if (fd < 0 || fd > 2)
        return fd;
    moved = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    saved = errno;
    close(fd);
    errno = saved;
    return moved;
}

/* Send the 4-byte header with our stdin, stdout, stderr and working directory (which the job's
 * process enters by this descriptor: the path may name another directory by then) in one
 * sendmsg; the bytes sent, or -1 with errno. */
static int send_header(int fd, unsigned char *header, size_t n)
{
    /* O_PATH: no read right needed */
    int fds[4] = {0, 1, 2, above_streams(open(".", O_PATH | O_DIRECTORY | O_CLOEXEC))}, rc, saved;
    union { struct cmsghdr align; char buf[CMSG_SPACE(sizeof fds)]; } control;
    struct iovec iov = {header, n};
    struct msghdr msg;
    struct cmsghdr *cmsg;
    if (fds[3] < 0)
        return -1;
    memset(&msg, 0, sizeof msg);
    memset(&control, 0, sizeof control);
    msg.msg_iov = &iov, msg.msg_iovlen = 1;
    msg.msg_control = control.buf, msg.msg_controllen = sizeof control.buf;
    cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET, cmsg->cmsg_type = SCM_RIGHTS, cmsg->cmsg_len = CMSG_LEN(sizeof fds);
    memcpy(CMSG_DATA(cmsg), fds, sizeof fds);
    do
        rc = (int)sendmsg(fd, &msg, MSG_NOSIGNAL);
    while (rc < 0 && errno == EINTR);
    saved = errno;
    close(fds[3]);
    errno = saved;
    return rc;
}

/* Send the request: its header (send_header), then its bytes; 0, -1 with errno, or -2 when it
 * is over MAX_REQUEST (warned). */
static int send_request(int fd, const char *path, int argc, char **argv)
{
    size_t size = 0;
    char *request = build_request(&size, argc, argv);
    unsigned char header[4] = {(unsigned char)(size >> 24), (unsigned char)(size >> 16), (unsigned char)(size >> 8),
                               (unsigned char)size};
    int rc;
    if (!request && size > MAX_REQUEST) {
        char why[96];
        snprintf(why, sizeof why, "(a request of %zu bytes, over %d)", size, MAX_REQUEST);
        warn_line(path, "did not take the job ", why);
        return -2;
    }
    if (!request)
        return -1;
    rc = send_header(fd, header, sizeof header);
    if (rc >= 0 && rc < (int)sizeof header) /* a stream socket sends a 4-byte message whole */
        rc = send_all(fd, (const char *)header + rc, sizeof header - (size_t)rc);
    if (rc >= 0)
        rc = send_all(fd, request, size);
    free(request);
    return rc < 0 ? -1 : 0;
}

/* Wait for the job's exit code, passing on SIGTERM, SIGINT and SIGHUP to its pid. */
static int wait_job(int fd, pid_t pid)
{
    static const int signals[] = {SIGTERM, SIGINT, SIGHUP};
    struct sigaction sa;
    char kind = 0;
    int32_t code = 0;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = forward; /* no SA_RESTART: recv_upto retries EINTR itself */
    sigemptyset(&sa.sa_mask);
    job_pid = pid;
    for (size_t i = 0; i < sizeof signals / sizeof signals[0]; i++)
        sigaction(signals[i], &sa, NULL);
    if (read_reply(fd, &kind, &code) == 1 && kind == 'X')
        return code;
    if (!forwarded)
        fprintf(stderr, "pegasus-transfer: the node stager's process %ld ended without an exit status\n", (long)pid);
    return 1;
}

/* Hand the job to the stager at path: 1 with *code its exit code, or 0 (nothing ran; warned). */
static int hand_off(const char *path, int argc, char **argv, int *code)
{
    char kind = 0, why[512];
    int32_t value = 0;
    int fd = connect_stager(path), sent, got = -1;
    if (fd < 0)
        return 0;
    sent = send_request(fd, path, argc, argv);
    if (sent == -2) {
        close(fd);
        return 0;
    }
    if (sent == 0)
        got = read_reply(fd, &kind, &value);
    snprintf(why, sizeof why, "(%s)", got < 0 ? strerror(errno) : "it closed the connection");
    if (got == 1 && kind == 'R') {
        unsigned char reason[MAX_REASON];
        size_t want = value < 0 ? 0 : value > MAX_REASON ? MAX_REASON : (size_t)value;
        ssize_t n = recv_upto(fd, reason, want);
        fprintf(stderr, "pegasus-transfer: node stager %s refused the job: ", path);
        put_utf8_replaced(reason, n > 0 ? (size_t)n : 0);
        fputs("; transferring in this process\n", stderr);
    } else if (got == 1 && kind == 'P') {
        *code = wait_job(fd, (pid_t)value);
        close(fd);
        return 1;
    } else {
        warn_line(path, "did not take the job ", why);
    }
    close(fd);
    return 0;
}

/* Replace this process by the Python drop-in beside our real path; returns only on failure. */
static int run_python(char **argv)
{
    char self[PATH_MAX], script[PATH_MAX + sizeof PY_NAME];
    char *fallback[] = {PY_NAME, NULL}, *slash;
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n >= 0)
        self[n] = '\0';
    else if (!(argv && argv[0] && strchr(argv[0], '/') && realpath(argv[0], self))) { /* no /proc */
        fprintf(stderr, "pegasus-transfer: cannot find this program's path (/proc/self/exe): %s\n", strerror(errno));
        return 127;
    }
    slash = strrchr(self, '/');
    snprintf(script, sizeof script, "%.*s/%s", slash ? (int)(slash - self) : 1, slash ? self : ".", PY_NAME);
    if (setenv(NATIVE_VAR, self, 1) == 0)
        execv(script, argv && argv[0] ? argv : fallback);
    fprintf(stderr, "pegasus-transfer: cannot run the Python drop-in %s: %s\n", script, strerror(errno));
    return 127;
}

int main(int argc, char **argv)
{
    const char *raw = getenv(ENV_VAR);
    if (raw) {
        size_t start = 0, end = strlen(raw);
        while (start < end && is_space(raw[start]))
            start++;
        while (end > start && is_space(raw[end - 1]))
            end--;
        if (end > start) {
            char *path = strndup(raw + start, end - start);
            int code = 0;
            if (path && hand_off(path, argc, argv, &code))
                return code;
            free(path);
            setenv(TRIED_VAR, "1", 1);
        }
    }
    return run_python(argv);
}
