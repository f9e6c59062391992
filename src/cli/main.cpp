// Placeholder entry point; replaced by the CLI helper.
#include <cstdio>
int main() { std::puts("tpcli " TPCLI_VERSION); return 0; }
