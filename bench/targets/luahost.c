/* A host for the Lua 5.4 interpreter (built from the lua-src crate's sources by
 * `bench/seeds iprobe`): runs the script named by argv[1], its argv[2..] as `arg`. */
#include <stdio.h>
#include "lauxlib.h"
#include "lua.h"
#include "lualib.h"

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: luahost SCRIPT [ARGS]\n");
        return 2;
    }
    lua_State *L = luaL_newstate();
    luaL_openlibs(L);
    lua_newtable(L);
    for (int i = 2; i < argc; i++) {
        lua_pushstring(L, argv[i]);
        lua_rawseti(L, -2, i - 1);
    }
    lua_setglobal(L, "arg");
    if (luaL_dofile(L, argv[1]) != LUA_OK) {
        fprintf(stderr, "luahost: %s\n", lua_tostring(L, -1));
        return 1;
    }
    lua_close(L);
    return 0;
}
