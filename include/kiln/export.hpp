// What libkiln exports: it is built with hidden symbols, and KILN_API marks the public API
// (the declarations under include/kiln), so internal symbols neither clash with an
// application's nor become an ABI.
#pragma once

#if defined(_WIN32)
#define KILN_API __declspec(dllexport)
#else
#define KILN_API __attribute__((visibility("default")))
#endif
