/* Preloaded into rankmesh (LD_PRELOAD): answers MPI_Get_library_version as
 * Intel MPI does, so a binary built against Open MPI's headers meets what
 * it would meet with an MPICH-family library first on its path. Nothing
 * else is replaced; rankmesh must refuse before any other MPI call. */
#include <string.h>

int MPI_Get_library_version(char *version, int *resultlen) {
#ifdef OTHER_IS_OPEN_MPI
    /* For a binary built against the MPICH family: Open MPI's line. */
    const char *v = "Open MPI v4.1.4, package: Debian OpenMPI\n";
#else
    const char *v = "Intel(R) MPI Library 2021.19 for Linux* OS\n";
#endif
    strcpy(version, v);
    *resultlen = (int)strlen(v);
    return 0;
}
