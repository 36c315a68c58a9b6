# Writes the build-info source at build time (cmake -P), so the git commit is the one that was
# built, not the one that was configured. Inputs: SRC (source dir), TEMPLATE, OUT, and the
# configure-time values substituted into TEMPLATE (INFOFLOW_*). OUT is rewritten only when it
# changes, so an unchanged tree recompiles nothing.
set(INFOFLOW_GIT_COMMIT "unknown")
find_program(GIT git)
if(GIT)
    execute_process(COMMAND ${GIT} -C ${SRC} rev-parse --short=12 HEAD
                    OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE
                    RESULT_VARIABLE rc ERROR_QUIET)
    if(rc EQUAL 0 AND commit)
        set(INFOFLOW_GIT_COMMIT "${commit}")
        execute_process(COMMAND ${GIT} -C ${SRC} status --porcelain --untracked-files=no
                        OUTPUT_VARIABLE dirty RESULT_VARIABLE rc ERROR_QUIET)
        if(rc EQUAL 0 AND dirty)
            set(INFOFLOW_GIT_COMMIT "${commit}-dirty")
        endif()
    endif()
endif()
configure_file(${TEMPLATE} ${OUT}.tmp @ONLY)
file(COPY_FILE ${OUT}.tmp ${OUT} ONLY_IF_DIFFERENT)
file(REMOVE ${OUT}.tmp)
