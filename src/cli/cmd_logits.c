/* cmd_logits.c: placeholder until the module behind it lands; says so and fails. */
#include <stdio.h>

#include "cli.h"

int cmd_logits(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "hone logits: not implemented yet\n");
    return 1;
}
