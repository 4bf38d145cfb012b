/* Keeps Triton's admin key off its command line (/proc/<pid>/cmdline is world-readable; issue 56).
 *
 * tritonserver 2.51 takes the restricted-API key only inside its --http-restricted-api and
 * --grpc-restricted-protocol flags: no file, no environment variable. The launcher writes the mark
 * @TRITON_ADMIN_KEY@ there instead (launcher/exposure.py) and starts tritonserver with this library in
 * LD_PRELOAD: tritonserver parses its flags with glibc's getopt_long, and this getopt_long hands it each
 * option's value with the mark replaced by TRITON_ADMIN_KEY from the environment, which only the server's
 * own user (and root) can read (/proc/<pid>/environ is mode 0400). Any other option passes unchanged. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

static const char MARK[] = "@TRITON_ADMIN_KEY@";

int getopt_long(int argc, char *const argv[], const char *optstring, const struct option *longopts,
                int *longindex) {
    static int (*real)(int, char *const[], const char *, const struct option *, int *);
    if (!real)
        real = (int (*)(int, char *const[], const char *, const struct option *, int *))dlsym(RTLD_NEXT,
                                                                                             "getopt_long");
    int flag = real(argc, argv, optstring, longopts, longindex);
    const char *key = getenv("TRITON_ADMIN_KEY");
    char *at = optarg && key ? strstr(optarg, MARK) : NULL;
    if (at) {
        size_t head = (size_t)(at - optarg), mark = sizeof MARK - 1;
        char *value = malloc(head + strlen(key) + strlen(at + mark) + 1);  /* kept: the option's value */
        if (value) {
            memcpy(value, optarg, head);
            strcpy(value + head, key);
            strcat(value, at + mark);
            optarg = value;
        }
    }
    return flag;
}
