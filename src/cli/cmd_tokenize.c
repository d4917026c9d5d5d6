/* cmd_tokenize.c: placeholder until the module behind it lands; says so and fails. */
#include <stdio.h>

#include "cli.h"

int cmd_tokenize(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "hone tokenize: not implemented yet\n");
    return 1;
}
