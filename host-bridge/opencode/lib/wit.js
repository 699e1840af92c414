// The version of the world (wit/plugin.wit) this bridge speaks: the context index.js builds
// and the exports worker.js calls are written for it. A test keeps it equal to the package
// line of wit/plugin.wit; at load the bridge refuses a component built for another one.
export const WIT_PACKAGE = "boxd:plugin@0.1.0";

/** Throws, with what to do, when the component's manifest names another world version. */
export function checkWorld(manifest) {
  const theirs = manifest?.wit;
  if (theirs === WIT_PACKAGE) return;
  throw new Error(
    `opencode-boxd: the component in dist/ speaks ${theirs ?? "no boxd:plugin world"}, this plugin speaks ${WIT_PACKAGE}; ` +
      "rebuild the plugin from one checkout (npm run build in host-bridge/opencode) or reinstall it",
  );
}
