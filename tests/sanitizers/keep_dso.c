/* Preloaded into the MPI ranks of the sanitizer stage (launch/test-sanitizers.sh): dlclose does
 * nothing, so Open MPI's plugins (mca_*.so) stay mapped until exit. LeakSanitizer reports at exit;
 * with the plugins unmapped their frames have no module name and the Open MPI suppressions in
 * tests/fuzz/lsan_openmpi.supp cannot match them. Our code never calls dlclose on anything whose
 * unloading a test depends on. */
int dlclose(void* handle) {
    (void)handle;
    return 0;
}
