# smoke.cmake -- one fuzz.* CTest test: a bounded libFuzzer run over a copy of a seed corpus.
#
# cmake -DFUZZER=<fuzz_x> -DSEEDS=<tests/fuzz/corpus/x> -DWORK=<build dir> -DRUNS=N -DSECONDS=S
#       [-DDICT=<tests/fuzz/x.dict>] -P smoke.cmake
# WORK/corpus is recreated from SEEDS on every run (libFuzzer adds the new inputs it finds to its
# first corpus directory: the repo's seeds are never written); a crash leaves its input in WORK as
# crash-<sha1> (artifact_prefix) and fails the test with libFuzzer's exit code.
foreach(v FUZZER SEEDS WORK RUNS SECONDS)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "smoke.cmake: -D${v}=... is required")
  endif()
endforeach()
file(REMOVE_RECURSE ${WORK}/corpus)
file(MAKE_DIRECTORY ${WORK}/corpus)
if(IS_DIRECTORY ${SEEDS})
  file(GLOB seeds ${SEEDS}/*)
  if(seeds)
    file(COPY ${seeds} DESTINATION ${WORK}/corpus)
  endif()
endif()
set(dict_arg "")
if(DEFINED DICT AND EXISTS ${DICT})
  set(dict_arg -dict=${DICT})
endif()
execute_process(COMMAND ${FUZZER} ${dict_arg} -runs=${RUNS} -max_total_time=${SECONDS} -max_len=65536
                        -artifact_prefix=${WORK}/ -print_final_stats=1 ${WORK}/corpus
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${FUZZER} failed (${rc}); the input is in ${WORK}/crash-* "
                      "(reproduce: ${FUZZER} ${WORK}/crash-<sha1>)")
endif()
