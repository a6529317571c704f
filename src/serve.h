/* serve.h -- `kvrouter serve`: the router process. */
#ifndef KVR_SERVE_H
#define KVR_SERVE_H

/* Runs the router until SIGINT/SIGTERM. argv[0] is "serve". Returns the process exit code. */
int kvr_serve_main(int argc, char **argv);

#endif
