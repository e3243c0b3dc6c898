// Typesets the math that pymdownx.arithmatex (generic mode) wraps in <span|div class="arithmatex">,
// with the KaTeX copy vendored in docs/assets/katex (no network access needed). Runs on every page
// load, including the instant navigation of mkdocs-material (document$).
(function () {
  function typeset() {
    document.querySelectorAll(".arithmatex").forEach(function (el) {
      renderMathInElement(el, {
        delimiters: [
          { left: "\\(", right: "\\)", display: false },
          { left: "\\[", right: "\\]", display: true },
        ],
        throwOnError: true,
        errorCallback: function (msg, err) { console.error("KaTeX: " + msg, err); },
      });
    });
  }
  if (typeof document$ !== "undefined") {
    document$.subscribe(typeset);
  } else {
    document.addEventListener("DOMContentLoaded", typeset);
  }
})();
