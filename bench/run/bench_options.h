/* bench_options.h -- the options of `kvrouter bench`: one table (src/base/cli.h) that fills a
 * kvr_runner_opts_t from a command line and prints --help.
 *
 * The binary's `kvrouter bench` parses its argv with kvr_bench_options_main(); the libraries that
 * take a person's bench flags (the study's and the demo's "after --" options) apply them over
 * settings they filled as structs with kvr_bench_options_parse(). Both take kvrouter's flags and
 * `vllm bench serve`'s spellings of the same settings (bench/loadgen/README.md maps them; a vllm
 * flag with no kvrouter equivalent is an error naming it). Either way the rules between flags are
 * kvr_runner_opts_check()'s (runner.h).
 */
#ifndef KVR_BENCH_OPTIONS_H
#define KVR_BENCH_OPTIONS_H

#include "base/cli.h"
#include "runner_types.h"

#include <stddef.h>

/* The `kvrouter bench` command: its name, synopsis, paragraph and option table. The settings it
 * fills are a kvr_runner_opts_t; kvr_runner_opts_default() gives the defaults --help prints. */
extern const kvr_cli_cmd_t kvr_bench_options_cmd;

/* kvr_cli_main() for `kvrouter bench`: parses argv (argv[0] names the command) into o, kvrouter's
 * flags and vllm's; prints --help (both) or --version to stdout, an error as one line on stderr.
 * Returns KVR_CLI_CONTINUE, or the exit status (0 after help or version, 2). */
int kvr_bench_options_main(kvr_runner_opts_t *o, int argc, char **argv);

/* Applies the flags of argv (argv[0] names the command, e.g. "bench"; no --help) over o, which
 * holds defaults or settings filled as a struct: a scalar given replaces o's value, a list's first
 * occurrence replaces o's list. Does not check the rules between flags. Returns 0 or KVR_EINVAL
 * with one line "--flag: what is wrong" in err (values before the bad flag stay stored); -h,
 * --help and --version are errors here, nothing is printed. */
int kvr_bench_options_parse(kvr_runner_opts_t *o, int argc, char **argv, char *err, size_t errlen);

/* Frees the string list items in o (ab, labels), the option engine's heap copies, and a URL
 * composed from vllm's flags (o->lg.url_owned), and leaves those lists empty. */
void kvr_bench_options_free(kvr_runner_opts_t *o);

#endif
