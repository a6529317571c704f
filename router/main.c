/* main.c -- the kvrouter binary: one table of subcommands, each in its own file of router/.
 *
 *   kvrouter serve  the KV-cache-aware router (router/serve.c over src/ and policies/)
 *   kvrouter sim    a simulated vLLM worker (router/sim.c over bench/sim/)
 *   kvrouter bench  the load generator and A/B report (router/bench.c over bench/run/);
 *                   `kvrouter bench routing` times routing decisions (bench/routing/)
 *   kvrouter demo   4 simulated workers + router + A/B benchmark + report (router/demo.c over
 *                   bench/run/demo.h)
 *
 * Everything else lives in the libraries so it can be tested; this file only dispatches.
 */
#include "commands.h"
#include "kvr_commit.h" /* generated at build time: KVR_COMMIT */

#include <signal.h>
#include <stdio.h>
#include <string.h>

typedef struct {
  const char *name;
  int (*main)(int argc, char **argv);
  const char *help;
} subcommand_t;

static const subcommand_t subcommands[] = {
    {"serve", kvr_serve_main, "run the router in front of OpenAI-compatible (vLLM) workers"},
    {"sim", kvr_sim_main, "run a simulated vLLM worker (Llama-70B FP8 on one H200)"},
    {"bench", kvr_bench_main, "load-test an endpoint; A/B routing policies; write a report"},
    {"demo", kvr_demo_main, "4 simulated workers + router, round-robin vs KV-aware A/B report"},
};

static void usage(FILE *out) {
  fprintf(out, "usage: kvrouter <command> [options]   (kvrouter <command> --help for details)\n\n");
  for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++)
    fprintf(out, "  %-6s %s\n", subcommands[i].name, subcommands[i].help);
  fprintf(out, "\n  --version  print the version\n");
}

int main(int argc, char **argv) {
  /* A client or worker that goes away must not kill the process through SIGPIPE. */
  signal(SIGPIPE, SIG_IGN);
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0 ||
      strcmp(argv[1], "help") == 0) {
    usage(stdout);
    return 0;
  }
  if (strcmp(argv[1], "--version") == 0) {
    printf("kvrouter %s (commit %s)\n", KVR_VERSION, KVR_COMMIT);
    return 0;
  }
  for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++)
    if (strcmp(argv[1], subcommands[i].name) == 0)
      return subcommands[i].main(argc - 1, argv + 1);
  fprintf(stderr, "kvrouter: unknown command '%s' (try kvrouter --help)\n", argv[1]);
  return 2;
}
