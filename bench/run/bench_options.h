/* bench_options.h -- the options of `kvrouter bench`: one table (src/base/cli.h) that fills a
 * kvr_runner_opts_t from a command line and prints --help.
 *
 * The binary's `kvrouter bench` parses its argv with kvr_cli_main() over kvr_bench_options_cmd;
 * the libraries that take a person's bench flags (the study's and the demo's "after --" options)
 * apply them over settings they filled as structs with kvr_bench_options_parse(). Either way the
 * rules between flags are kvr_runner_opts_check()'s (runner.h).
 */
#ifndef KVR_BENCH_OPTIONS_H
#define KVR_BENCH_OPTIONS_H

#include "base/cli.h"
#include "runner_types.h"

#include <stddef.h>

/* The `kvrouter bench` command: its name, synopsis, paragraph and option table. The settings it
 * fills are a kvr_runner_opts_t; kvr_runner_opts_default() gives the defaults --help prints. */
extern const kvr_cli_cmd_t kvr_bench_options_cmd;

/* Applies the flags of argv (argv[0] names the command, e.g. "bench"; no --help) over o, which
 * holds defaults or settings filled as a struct: a scalar given replaces o's value, a list's first
 * occurrence replaces o's list. Does not check the rules between flags. Returns 0 or KVR_EINVAL
 * with one line "--flag: what is wrong" in err (values before the bad flag stay stored); -h,
 * --help and --version are errors here, nothing is printed. */
int kvr_bench_options_parse(kvr_runner_opts_t *o, int argc, char **argv, char *err, size_t errlen);

/* Frees the string list items in o (ab, labels), the option engine's heap copies, and leaves those
 * lists empty. */
void kvr_bench_options_free(kvr_runner_opts_t *o);

#endif
