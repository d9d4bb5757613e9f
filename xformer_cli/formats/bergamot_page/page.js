// The page of xf export bergamot: Bergamot's BatchTranslator over the files beside this page
// (registry.json names them, with their sha256 for the browser's integrity check).
import {BatchTranslator} from './translator.js';

const registryUrl = new URL('registry.json', import.meta.url).href;
const status = document.getElementById('status');
const button = document.getElementById('translate');

function say(text, state) {
    status.textContent = text;
    status.dataset.state = state;
}

const registry = await (await fetch(registryUrl)).json();
const [key] = Object.keys(registry);  // one direction: "ende" is en -> de (Bergamot's 2+2 letters)
const from = key.slice(0, 2), to = key.slice(2, 4);
document.getElementById('direction').textContent = `${from} → ${to}`;
const translator = new BatchTranslator({registryUrl, workers: 1, batchSize: 16});
// Set after construction: options are posted to the worker, which cannot take a function. A worker
// that fails to start only calls these (its translations never settle), so the page says it here.
translator.onerror = translator.backing.onerror = error => say(`Error: ${error.message}`, 'error');

// Lines -> their translations, in order; empty lines stay empty (Bergamot would drop them).
async function translateLines(lines) {
    return Promise.all(lines.map(text => text.trim()
        ? translator.translate({from, to, text, html: false}).then(response => response.target.text)
        : ''));
}
window.xfTranslate = translateLines;  // for scripts and tests: await xfTranslate(['A dog.'])

button.addEventListener('click', async () => {
    const lines = document.getElementById('source').value.split('\n');
    button.disabled = true;
    say('Translating…', 'busy');
    try {
        const start = performance.now();
        document.getElementById('target').value = (await translateLines(lines)).join('\n');
        const seconds = (performance.now() - start) / 1000;
        document.getElementById('speed').textContent = `${lines.length} lines in ${seconds.toFixed(2)} s`;
        say('Ready.', 'ready');
    } catch (error) {
        say(`Error: ${error.message}`, 'error');
    } finally {
        button.disabled = false;
    }
});

// The first translation loads the model into the worker: done here, so that the page says when it is ready.
try {
    await translateLines(['.']);
    say('Ready.', 'ready');
    button.disabled = false;
} catch (error) {
    say(`Error: ${error.message}`, 'error');
}
