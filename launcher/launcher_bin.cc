// `launcher`: the launcher's command (docs/LAUNCHING.md); the work is in launcher_main.cc.
#include "launcher/launcher_main.h"

int main(int argc, char** argv) { return braid::launcher::LauncherMain(argc, argv); }
