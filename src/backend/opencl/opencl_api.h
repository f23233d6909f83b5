/*
 * The OpenCL entry points the library uses, as one typed table filled at run
 * time from the ICD loader (libOpenCL.so.1) with dlopen/dlsym: the library
 * never links OpenCL, so it runs (without this back end) where none is
 * installed. The types come from the Khronos headers; each field has the
 * exact type of the function it holds (__typeof__ of the declaration).
 */
#ifndef MAPPING_BACKEND_OPENCL_API_H
#define MAPPING_BACKEND_OPENCL_API_H

#include <stdbool.h>
#include <stddef.h>
#include "mapping.h"

/* Without the headers the back end still exists, as one that says why it is
 * unavailable (opencl.c): the rest of the library builds and runs.
 * MAPPING_OPENCL_PRETEND_NO_HEADERS builds that variant on purpose. */
#if defined(__has_include) && !defined(MAPPING_OPENCL_PRETEND_NO_HEADERS)
#if __has_include(<CL/cl.h>)
#define MAPPING_OPENCL_HEADERS 1
#endif
#endif

#ifdef MAPPING_OPENCL_HEADERS
#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 300
#endif
#define CL_USE_DEPRECATED_OPENCL_1_2_APIS /* clCreateCommandQueue: the 1.x way, works everywhere */
#include <CL/cl.h>

/* OpenCL 1.2 entry points: every one must resolve, or the back end is unavailable. */
#define OPENCL_REQUIRED_ENTRY_POINTS(X)                                                                         \
    X(clGetPlatformIDs) X(clGetPlatformInfo) X(clGetDeviceIDs) X(clGetDeviceInfo) X(clCreateContext)        \
    X(clReleaseContext) X(clCreateCommandQueue) X(clReleaseCommandQueue) X(clFlush) X(clFinish)            \
    X(clCreateBuffer) X(clReleaseMemObject) X(clGetMemObjectInfo) X(clEnqueueMapBuffer)                     \
    X(clEnqueueUnmapMemObject) X(clEnqueueWriteBuffer) X(clEnqueueReadBuffer) X(clEnqueueCopyBuffer)        \
    X(clEnqueueFillBuffer) X(clEnqueueMarkerWithWaitList) X(clEnqueueBarrierWithWaitList)                   \
    X(clCreateUserEvent) X(clSetUserEventStatus) X(clWaitForEvents) X(clGetEventInfo)                       \
    X(clGetEventProfilingInfo) X(clReleaseEvent) X(clCreateProgramWithSource) X(clBuildProgram)            \
    X(clGetProgramBuildInfo) X(clReleaseProgram) X(clCreateKernel) X(clReleaseKernel) X(clSetKernelArg)     \
    X(clGetKernelWorkGroupInfo) X(clEnqueueNDRangeKernel)                                                  \
    X(clRetainContext) /* several devices share a platform's context */

/* OpenCL 2.0+ entry points: NULL when the loader lacks them (then no SVM);
 * the program-binary calls, without which kernels are built from source;
 * and the adoption calls. */
#define OPENCL_OPTIONAL_ENTRY_POINTS(X)                                                                        \
    X(clSVMAlloc) X(clSVMFree) X(clCreateProgramWithBinary) X(clGetProgramInfo) OPENCL_IMPORT_ENTRY_POINTS(X)
/* For adopting objects made elsewhere (opencl_import.c); NULL: no adoption. */
#define OPENCL_IMPORT_ENTRY_POINTS(X)                                                                          \
    X(clRetainCommandQueue) X(clRetainMemObject) X(clGetContextInfo)                                     \
    X(clGetCommandQueueInfo) X(clCreateSubBuffer)

typedef struct opencl_api {
#define OPENCL_API_FIELD_(name) __typeof__(&name) name;
    OPENCL_REQUIRED_ENTRY_POINTS(OPENCL_API_FIELD_)
    OPENCL_OPTIONAL_ENTRY_POINTS(OPENCL_API_FIELD_)
#undef OPENCL_API_FIELD_
} opencl_api;

/* The table; valid after mapping__opencl_api_load() returned MAPPING_OK. */
extern opencl_api mapping__opencl_driver;

/* Loads the library ($MAPPING_OPENCL_LIBRARY, else libOpenCL.so.1, else
 * libOpenCL.so) and resolves every entry point, once per process. On failure
 * writes the reason (dlerror(), or the first missing symbol) into why. */
mapping_status mapping__opencl_api_load(char *why, size_t why_size);

/* "CL_INVALID_VALUE" for -30; "CL_UNKNOWN_ERROR" for codes it does not know. */
const char *mapping__opencl_error_name(cl_int code);
/* Records a failed driver call (raw code and name) and returns the matching
 * status: out-of-memory codes map to MAPPING_ERR_OUT_OF_*_MEMORY, the rest to
 * MAPPING_ERR_DRIVER. */
mapping_status mapping__opencl_fail(const char *call, cl_int code);
mapping_status mapping__opencl_status_of(cl_int code);

#endif /* MAPPING_OPENCL_HEADERS */
#endif
