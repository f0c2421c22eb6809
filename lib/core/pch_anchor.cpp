// Anchor translation unit for the shared LibTorch precompiled header (see lib/CMakeLists.txt).
